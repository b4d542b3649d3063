"""bench/parity_vllm_bench.py in CI-sized form on a real llama.cpp server (conftest's SmolLM2 server, 2 slots).

vLLM's own client does not install on this CPU machine (its CUDA wheel), so the reference here is vLLM's
definitions (vllm@4ba787ec9:vllm/benchmarks/serve.py calculate_metrics, engine-facts §5.3) applied to the same
per-request samples: quantrack's figures must equal them (a ratio away from 1 = a definition that drifted), and
the second pass with more requests per level is recorded with the in-flight share that explains the difference."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
BENCH = Path(__file__).resolve().parents[2] / "bench" / "parity_vllm_bench.py"


def _bench() -> object:
    spec = importlib.util.spec_from_file_location("parity_vllm_bench", BENCH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parity_bench_ci_sized(llamacpp_server: str, tmp_path: Path) -> None:
    bench = _bench()
    args = argparse.Namespace(engine="llamacpp", model=None, tokenizer=None, concurrency="1,2", requests=4,
                              compare_requests=6, input_tokens=16, output_tokens=6, rounds=2,
                              reference="definitions", vllm_json=None, hit_rate_tolerance=0.05,
                              accept_unknown_cache=False, seed=7)
    res = bench.run(args, llamacpp_server)  # type: ignore[attr-defined]
    text = bench.render(res)  # type: ignore[attr-defined]
    print(text)
    assert [lv["concurrency"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        for p in lv["rounds"]:
            assert p["quantrack"]["n_failed"] == 0 and p["more_requests"]["n_failed"] == 0
        # same samples, vLLM's formulas: identical to 1e-9 (medians: numpy's linear rule = quantrack's p50)
        for k in ("output_tok_s", "median_ttft_ms", "median_tpot_ms"):
            assert lv[f"ratio_{k}"] == pytest.approx(1.0, abs=1e-9), (k, lv)
            assert math.isfinite(lv[f"more_requests_ratio_{k}"]) and lv[f"more_requests_ratio_{k}"] > 0
        # mean requests in flight never exceeds the level; the client's CPU per token is measured
        assert 0 < lv["in_flight_share"] <= 1.0 + 1e-9 and 0 < lv["in_flight_share_more_requests"] <= 1.0 + 1e-9
        assert lv["client_cpu_ms_per_token"] > 0
        # the engine's counters were read before and after each run: llama.cpp serves them (--metrics)
        for p in lv["rounds"]:
            cache = p["quantrack_cache"]
            assert cache["hit_rate"] is not None and 0 <= cache["hit_rate"] <= 1 and cache["queries"] > 0, cache
            assert p["refused"] is None  # the same run on both sides: equal hit rates
        assert lv["rounds_compared"] == 2
    json.dumps(res, default=str)  # the --json file is serialisable


def test_vllm_save_result_import(tmp_path: Path) -> None:
    """The keys vllm bench serve --save-result writes (vllm@v0.31.0 vllm/benchmarks/serve.py:1298-1299, :1402)."""
    bench = _bench()
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"duration": 12.5, "completed": 1000, "output_throughput": 9876.5,
                             "median_ttft_ms": 41.0, "median_tpot_ms": 7.25, "max_concurrency": 64,
                             "request_goodput": None, "p99_tpot_ms": 9.0}))
    got = bench.import_vllm_result(p)  # type: ignore[attr-defined]
    assert got["output_tok_s"] == 9876.5 and got["median_tpot_ms"] == 7.25 and got["max_concurrency"] == 64
    p.write_text(json.dumps({"duration": 1.0}))
    with pytest.raises(bench.BadArgs, match="missing output_throughput, median_ttft_ms, median_tpot_ms"):  # type: ignore[attr-defined]
        bench.import_vllm_result(p)  # type: ignore[attr-defined]
