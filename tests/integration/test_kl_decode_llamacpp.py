"""The decode-side KL method against real llama.cpp servers (xllamacpp, SmolLM2-135M F16 GGUF, 127.0.0.1 only).

F16 weights with an f16 KV cache (baseline) against the same weights with a q8_0 KV cache (K and V), scored both
ways on a bounded number of positions (two shared cores): teacher-forced on GSM8K reference answers, and
decode-greedy (the baseline's own greedy continuation, one cached step per token). Numbers: docs/kv-cache.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

xllamacpp = pytest.importorskip("xllamacpp")
lifecycle = pytest.importorskip("quantrack.engines.lifecycle")

from quantrack.accuracy.kl import KLMethod, run_kl
from quantrack.arms import make_arm

POSITIONS = 160


@pytest.fixture(scope="module")
def kv_servers(gguf_arms: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    logs = tmp_path_factory.mktemp("kv-servers")
    servers = {}
    try:
        for name, kv in (("f16", "auto"), ("f16-kvq8_0", "q8_0")):
            srv = lifecycle.server_for_arm("llamacpp", str(gguf_arms["F16"]), make_arm(name, weights="f16", kv=kv),
                                           context_len=2048, parallel=1, extra_args=("-t", "1"),
                                           log_path=logs / f"{name}.log", startup_timeout=180)
            servers[name] = srv.start()
        yield {name: s.base_url for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()


def test_decode_greedy_against_itself_is_exact(kv_servers: dict[str, str]) -> None:
    url = kv_servers["f16"]
    r = run_kl(url, url, "llamacpp", tokens=48, method=KLMethod.DECODE_GREEDY, decode_tokens_per_text=24)
    assert r.kl_method == "decode-greedy" and r.n_positions == 48 and r.n_texts >= 2  # stops at end-of-sequence
    assert r.top1_agree == 1.0 and r.kl_mean < 1e-4


def test_q8_0_kv_cache_both_methods(kv_servers: dict[str, str], record_property: pytest.FixtureRequest) -> None:
    base, cand = kv_servers["f16"], kv_servers["f16-kvq8_0"]
    tf = run_kl(base, cand, "llamacpp", tokens=POSITIONS)
    dg = run_kl(base, cand, "llamacpp", tokens=POSITIONS, method=KLMethod.DECODE_GREEDY, decode_tokens_per_text=80)
    assert (tf.kl_method, dg.kl_method) == ("teacher-forced", "decode-greedy")
    assert tf.n_positions == dg.n_positions == POSITIONS
    assert dg.n_texts >= 2 and "greedily" in dg.method
    for r in (tf, dg):
        # a quantized KV cache moves the distribution (above the ~1e-5 nats an identical server shows) ...
        assert 1e-4 < r.kl_mean < 0.1
        assert 0.9 <= r.top1_agree <= 1.0
        assert 0.0 <= r.kl_lower_mean <= r.kl_mean
    print(f"\nq8_0 KV vs f16 KV, SmolLM2-135M F16, {POSITIONS} positions:"
          f"\n  teacher-forced: top-1 {tf.top1_agree:.4f} KL {tf.kl_mean:.5f} CI {tf.ci}"
          f"\n  decode-greedy:  top-1 {dg.top1_agree:.4f} KL {dg.kl_mean:.5f} CI {dg.ci} texts {dg.n_texts}")
