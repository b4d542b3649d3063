"""A fake engine for quantrack's own code paths (run_study, run_arm, interrupts, FAILED/KILLED logging), registered
by the tests that need it and never shipped: the proof that an engine is one module (docs/engines.md).

Everything engine-specific is here and nowhere else: ``register()`` adds it to quantrack's registry, and the study
file, the rulebook (its ``methods`` table), detection (its marker), the log parser, the launch, the live
queries and the decode-side KL (its next-token request and parser) all find it through the adapter. What it serves
is real test material, not invented output:

- the server is tests/sse_fixture.py run as a process (chunks shaped like real llama.cpp streams,
  tests/data/llamacpp-stream-completions.sse), started and stopped by quantrack's ManagedServer;
- its startup log is a real xllamacpp log (tests/data/logs/xllamacpp-SmolLM2-Q8_0-np1.log, provenance in
  tests/data/logs/README.md), printed by the fixture before it serves and parsed with llama.cpp's rules.

It evidences nothing about any real engine: only that quantrack's orchestration, records and statuses work.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from quantrack import engines
from quantrack.engines.base import (
    EngineAdapter,
    Install,
    LaunchSpec,
    LiveFacts,
    LogReport,
    Marker,
    MemoryModel,
    Serving,
)
from quantrack.engines.logparse import FileSource, RuleSpec

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "sse_fixture.py"
CANNED_LOG = HERE / "data" / "logs" / "xllamacpp-SmolLM2-Q8_0-np1.log"
KIND = "fake"


class FakeAdapter(EngineAdapter):
    kind = KIND
    label = "fake engine"
    serving = Serving(default_port=0)
    memory = MemoryModel(gpu_share=False)  # a CPU process: no GPU, no memory share
    install = Install(needs_gpu=False, release_versions=False)
    # the fixture's first line ("PORT 41234"): a weak marker, enough for a log that has nothing else
    markers = (Marker(KIND, "fixture port line", r"^PORT \d+$", 3, "tests/sse_fixture.py (__main__)", ("PORT ",)),)
    # the rulebook's table for this engine (rules/methods.toml has none): GGUF-like weights, two KV types
    methods = MappingProxyType({"source": "tests/fake_engine.py", "assumed_version": "0", "quant_flag": "",
                                "kv_flag": "--kv", "dtype_flag": "", "dtype": {}, "kv": {"q8_0": "q8_0"},
                                "kv_choices": ["f16", "q8_0"], "method_aliases": {}, "methods": {}})

    def __init__(self, interval_ms: float = 2.0, log: Path = CANNED_LOG) -> None:
        self.interval_ms = interval_ms  # time between streamed tokens
        self.log = log

    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        return [sys.executable, str(FIXTURE), "--port", str(spec.port), "--interval-ms", f"{self.interval_ms:g}",
                "--log", str(self.log)]

    def parse_log(self, lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource,
                  source: str | None = None, extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
        from quantrack.engines.llamacpp import parse_llamacpp_log

        report = parse_llamacpp_log(lines, source, extra_rules)  # the canned log is llama.cpp's
        report.engine = self.kind
        return report

    # the decode-side KL (quantrack.accuracy.kl, method decode-greedy): llama.cpp's one-token request and its answer,
    # which the fixture serves at /completion (a real llama.cpp response)
    def next_token_request(self, prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        from quantrack.engines.llamacpp import llamacpp_request

        return llamacpp_request(prefix, k)

    def parse_next_token(self, resp: Any, k: int) -> tuple[dict[int, float], bool]:
        from quantrack.engines.llamacpp import parse_llamacpp_next

        return parse_llamacpp_next(resp, k)

    def query(self, base_url: str, timeout: float = 10.0) -> LiveFacts:
        import httpx

        r = httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=timeout)
        r.raise_for_status()
        return LiveFacts(self.kind, base_url, {"model": r.json()["data"][0]["id"]})


@contextmanager
def registered(adapter: FakeAdapter | None = None) -> Iterator[FakeAdapter]:
    """The fake engine registered for the duration of a ``with`` block (one registration hook, undone after)."""
    a = adapter or FakeAdapter()
    engines.register(a)
    try:
        yield a
    finally:
        engines.unregister(a.kind)
