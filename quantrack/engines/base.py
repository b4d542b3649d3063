"""The one interface every engine adapter implements (vLLM, SGLang, llama.cpp).

Adapters own everything engine-specific: flag spellings, the launch argv, the startup-log
format and the live endpoints. The rest of quantrack talks to engines only through this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantrack.arms import Arm


@dataclass
class LogEvent:
    """A fallback, warning or error found in a log: what kind, where, and the line itself."""

    kind: str
    line_no: int
    line: str


@dataclass
class LogReport:
    """What a startup log says. ``None`` means "not found in the log", never zero."""

    engine: str | None = None
    engine_version: str | None = None
    source: str | None = None  # file name
    gpu: str | None = None
    weights_gib: float | None = None
    available_kv_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_context: int | None = None
    cuda_graph_gib: float | None = None
    quantization: str | None = None
    linear_kernel: str | None = None
    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific figures (llama.cpp K/V MiB ...)
    fallbacks: list[LogEvent] = field(default_factory=list)
    warnings: list[LogEvent] = field(default_factory=list)
    errors: list[LogEvent] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)  # names of the fields above the log did not give
    engine_evidence: list[dict[str, Any]] = field(default_factory=list)  # the lines that decided the engine
    detection: dict[str, Any] = field(default_factory=dict)  # how the engine was chosen (auto scores | given)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fell_back(self) -> bool:
        return bool(self.fallbacks)


@dataclass
class LaunchSpec:
    """Everything an adapter needs to build a launch command for one arm."""

    model: str  # what the engine serves (HF id / dir / GGUF file)
    arm: Arm
    host: str = "127.0.0.1"
    port: int = 8000
    context_len: int | None = None
    util: float | None = None  # vLLM --gpu-memory-utilization / SGLang --mem-fraction-static
    tp: int = 1
    parallel: int = 1  # llama.cpp slots (-np)
    served_name: str | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    binary: str | None = None

    def server_flags(self, util: str, context: str, tp: str) -> list[str]:
        """The memory / context / TP / served-name flags of a GPU server, under this engine's spellings;
        the arm's own args and the study's extra args come last, so they win."""
        out: list[str] = []
        if self.util is not None:
            out += [util, f"{self.util:g}"]
        if self.context_len:
            out += [context, str(self.context_len)]
        if self.tp and self.tp != 1:
            out += [tp, str(self.tp)]
        if self.served_name:
            out += ["--served-model-name", self.served_name]
        return out + list(self.arm.engine_args) + list(self.extra_args)


class EngineAdapter(ABC):
    """One per engine, registered by ``kind`` in ``quantrack.engines``."""

    kind: str = ""
    default_port: int = 8000

    @abstractmethod
    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        """The exact command (a list; never run through a shell) that serves this arm."""

    def launch_env(self, spec: LaunchSpec) -> dict[str, str]:
        """Extra environment for the server process (arm env included)."""
        return {**spec.env, **spec.arm.env_dict}

    @abstractmethod
    def parse_log(self, lines: Iterable[str], source: str | None = None) -> LogReport:
        """Parse a startup log, streaming line by line."""

    def parse_log_file(self, path: str | Path) -> LogReport:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return self.parse_log(fh, source=str(path))

    @abstractmethod
    def query(self, base_url: str, timeout: float = 10.0) -> dict[str, Any]:
        """Live facts from a running server (version, model, KV capacity where exposed)."""
