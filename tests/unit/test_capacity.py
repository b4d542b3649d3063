"""Capacity arithmetic: the seeds' tables reproduce exactly; engine-aware predictions vs real H200 logs."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from quantrack.arms import parse_arm_spec
from quantrack.errors import BadInput
from quantrack.hardware.capacity import (
    W4A16_GROUP_OVERHEAD,
    kv_bytes_per_element,
    llamacpp_cells,
    llamacpp_kv_bytes,
    plan,
    predict_engine,
    predict_for_arm,
    sglang_default_mem_fraction,
    weight_bytes_per_param,
)
from quantrack.hardware.catalog import ModelShape, get_gpu, get_model

GiB = 2**30
ARMS3 = [parse_arm_spec(a) for a in ("bf16", "fp8", "fp8-kv")]


def test_bytes_tables() -> None:
    assert weight_bytes_per_param("bf16") == 2 and weight_bytes_per_param("fp8") == 1
    assert weight_bytes_per_param("w4a16") == 0.5 + 2.5 / 128 == 0.5 + W4A16_GROUP_OVERHEAD
    assert weight_bytes_per_param("q8_0") == 34 / 32 and weight_bytes_per_param("q4_0") == 18 / 32
    assert weight_bytes_per_param("f16") == 2
    assert kv_bytes_per_element("fp8_e4m3") == 1 and kv_bytes_per_element("q8_0") == 34 / 32
    assert kv_bytes_per_element("nvfp4") == 0.5625 and kv_bytes_per_element("f32") == 4
    with pytest.raises(BadInput):
        kv_bytes_per_element("int3")


def test_lab06_llama3_8b_on_24gib() -> None:
    """lab06 §1 table: 58,351 / 119,615 / 239,230 tokens; 14.96 / 7.48 GiB; 7.12 / 14.60 GiB; 2.05x, 4.10x."""
    shape = ModelShape(name="seed", params=8.03e9, layers=32, kv_heads=8, head_dim=128)
    rows = plan(shape, 24 * GiB, ARMS3, util=0.92)
    assert [r.token_capacity for r in rows] == [58_351, 119_615, 239_230]
    assert [round(r.weights_bytes / GiB, 2) for r in rows] == [14.96, 7.48, 7.48]
    assert [round(r.kv_budget_bytes / GiB, 2) for r in rows] == [7.12, 14.60, 14.60]
    assert [r.kv_bytes_per_token for r in rows] == [131_072, 131_072, 65_536]
    assert [round(r.vs_baseline or 0, 2) for r in rows] == [1.00, 2.05, 4.10]


def test_lab06_llama3_70b_tp2() -> None:
    """lab06 answer 1: 2 x 80 GiB, TP 2 -> about 51,436 -> 266,890 tokens (5.2x)."""
    shape = get_model("Llama-3-70B")
    rows = plan(shape, 80 * GiB, ARMS3[:2], util=0.92, tp=2)
    assert [r.token_capacity for r in rows] == [51_436, 266_890]
    assert round(rows[1].vs_baseline or 0, 1) == 5.2


def test_vllm_article_qwen_16gb() -> None:
    """vllm-article Experiment 1: bf16 DOES NOT FIT, INT8 ~25, 4-bit ~41 (the article ignores group overhead)."""
    shape = get_model("Qwen2.5-7B")
    arms = [parse_arm_spec(a) for a in ("bf16", "int8", "w4a16")]
    rows = plan(shape, 16e9, arms, util=0.90, overhead_bytes=1e9, context_len=4096)
    assert not rows[0].fits and round(rows[0].kv_budget_bytes / 1e9, 2) == -1.83 and rows[0].token_capacity == 0
    assert round(rows[1].weights_bytes / 1e9, 2) == 7.62 and round(rows[1].concurrency) == 25
    # With the group-128 scale/zero overhead the 4-bit weights are 3.96 GB, not 3.81: 40.2 concurrent, not 40.8.
    assert round(rows[2].weights_bytes / 1e9, 2) == 3.96 and round(rows[2].concurrency, 1) == 40.2
    article = (14.4e9 - shape.params * 0.5 - 1e9) / 57_344 / 4096
    assert round(article) == 41  # the article's own arithmetic, for the record


def test_plan_rejects_bad_values() -> None:
    shape = get_model("Llama-3-8B")
    with pytest.raises(BadInput, match=r"--util must be in \(0, 1\], got 1.5"):
        plan(shape, 24 * GiB, ARMS3, util=1.5)
    with pytest.raises(BadInput, match="params must be greater than zero"):
        plan(replace(shape, params=0), 24 * GiB, ARMS3)


# --- engine-aware vs the real H200 logs (../shared/data) ------------------------------------------------------

_VLLM = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_SGL = re.compile(r"max_total_num_tokens=(\d+)")
_VLLM_W = re.compile(r"Model loading took ([\d.]+) GiB")


def _grab(path: Path, pattern: re.Pattern[str]) -> str:
    m = pattern.search(path.read_text(encoding="utf-8", errors="replace"))
    assert m, f"{pattern.pattern} not in {path.name}"
    return m.group(1)


H200_LLAMA = replace(get_model("Llama-3-8B"), params=8_030_261_248.0)  # ../shared/gpu/make_model.py checkpoint


@pytest.mark.parametrize(("arm", "log", "tolerance"), [
    ("bf16", "vllm-0.25.0-bf16.log", 0.002), ("fp8", "vllm-0.25.0-fp8.log", 0.002),
    ("fp8-kv", "vllm-0.25.0-fp8kv.log", 0.002),
])
def test_vllm_prediction_vs_h200_logs(shared_data: Path, arm: str, log: str, tolerance: float) -> None:
    observed = int(_grab(shared_data / "vllm-h200" / log, _VLLM).replace(",", ""))
    pred = predict_engine(H200_LLAMA, get_gpu("H200").total_bytes, parse_arm_spec(arm), "vllm", util=0.92,
                          context_len=8192, gpu_name="H200")
    assert abs(pred.engine_tokens / observed - 1) < tolerance, (pred.engine_tokens, observed)
    assert pred.engine_tokens % 16 == 0 and pred.naive_tokens > pred.engine_tokens


def test_vllm_fp8_weights_keep_embeddings_bf16(shared_data: Path) -> None:
    logged = float(_grab(shared_data / "vllm-h200" / "vllm-0.25.0-fp8.log", _VLLM_W))  # 8.5
    pred = predict_engine(H200_LLAMA, get_gpu("H200").total_bytes, parse_arm_spec("fp8"), "vllm")
    assert abs(pred.weights_bytes / GiB - logged) < 0.05  # 8.457 predicted; params x 1 B would be 7.48
    assert any("kept at 2 bytes" in a for a in pred.assumptions)


@pytest.mark.parametrize(("arm", "log"), [
    ("bf16", "sglang-0.5.16-bf16.log"), ("fp8", "sglang-0.5.16-fp8.log"), ("fp8-kv", "sglang-0.5.16-fp8kv.log"),
])
def test_sglang_prediction_vs_h200_logs(shared_data: Path, arm: str, log: str) -> None:
    observed = int(_grab(shared_data / "sglang-h200" / log, _SGL))
    pred = predict_engine(H200_LLAMA, get_gpu("H200").total_bytes, parse_arm_spec(arm), "sglang", context_len=8192)
    assert pred.settings["mem_fraction_static"] == 0.903  # the value in the log's server_args
    assert abs(pred.engine_tokens / observed - 1) < 0.005, (pred.engine_tokens, observed)


def test_sglang_default_mem_fraction_matches_log(shared_data: Path) -> None:
    text = (shared_data / "sglang-h200" / "sglang-0.5.16-bf16.log").read_text(encoding="utf-8", errors="replace")
    logged = float(re.search(r"mem_fraction_static=([\d.]+)", text).group(1))  # type: ignore[union-attr]
    assert sglang_default_mem_fraction(get_gpu("H200").total_bytes) == logged


# --- the same card at memory fraction 0.45 (second H200 session; startup logs kept verbatim in tests/data) --------

H200_045 = Path(__file__).resolve().parents[1] / "data" / "logs" / "h200-util045"


@pytest.mark.parametrize(("engine", "arm", "log", "pattern", "tolerance"), [
    ("vllm", "bf16", "vllm-0.25.0-bf16.log", _VLLM, 0.007),      # -0.58%
    ("vllm", "fp8-kv", "vllm-0.25.0-fp8kv.log", _VLLM, 0.005),   # -0.38%
    ("sglang", "bf16", "sglang-0.5.16-bf16.log", _SGL, 0.003),   # +0.15%
    ("sglang", "fp8-kv", "sglang-0.5.16-fp8kv.log", _SGL, 0.007),  # +0.62%
])
def test_prediction_at_util_045_vs_h200_logs(engine: str, arm: str, log: str, pattern: re.Pattern[str],
                                            tolerance: float) -> None:
    """Calibrated at 0.92 / 0.903; these logs were taken at 0.45 and nothing was refitted."""
    text = (H200_045 / log).read_text(encoding="utf-8")
    assert ("--gpu-memory-utilization 0.45" in text or "'gpu_memory_utilization': 0.45" in text
            or "mem_fraction_static=0.45" in text)
    observed = int(_grab(H200_045 / log, pattern).replace(",", ""))
    pred = predict_engine(H200_LLAMA, get_gpu("H200").total_bytes, parse_arm_spec(arm), engine, util=0.45,
                          context_len=8192, gpu_name="H200")
    assert abs(pred.engine_tokens / observed - 1) < tolerance, (pred.engine_tokens, observed)


# --- llama.cpp: exact -----------------------------------------------------------------------------------------

_LCPP = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
                   r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")


@pytest.mark.parametrize("log", ["xllamacpp-F16-kvf16.log", "xllamacpp-Q8_0-kvq8_0.log"])
def test_llamacpp_kv_exact(shared_data: Path, log: str) -> None:
    text = (shared_data / "llamacpp-cpu" / log).read_text(encoding="utf-8", errors="replace")
    m = _LCPP.search(text)
    assert m, "KV size line not found"
    total, cells, layers, type_k, k_mib = float(m[1]), int(m[2]), int(m[3]), m[6], float(m[7])
    n_ctx = int(re.search(r"llama_context: n_ctx += (\d+)", text).group(1))  # type: ignore[union-attr]
    per_stream, streams = llamacpp_cells(n_ctx, n_parallel=int(m[5]))
    assert per_stream * streams == cells and layers == 30
    k, v = llamacpp_kv_bytes(get_model("SmolLM2-135M"), per_stream * streams, type_k, m[8])
    assert f"{(k + v) / 2**20:.2f}" == f"{total:.2f}" and f"{k / 2**20:.2f}" == f"{k_mib:.2f}"


def test_llamacpp_four_slots_same_bytes() -> None:
    """engine-facts §1.5: n_ctx 2048 with 4 slots -> 512 cells x 4 streams, 23.91 MiB at q8_0."""
    assert llamacpp_cells(2048, 4) == (512, 4)
    pred = predict_engine(get_model("SmolLM2-135M"), 8 * GiB, parse_arm_spec("weights=q8_0,kv=q8_0"), "llamacpp",
                          context_len=2048, n_parallel=4)
    assert f"{pred.kv_bytes / 2**20:.2f}" == "23.91" and pred.settings["streams"] == 4


def test_predict_for_arm() -> None:
    p = predict_for_arm(get_model("Llama-3-8B"), get_gpu("H100"), parse_arm_spec("fp8"), "vllm", context_len=4096)
    assert p.basis == "derived" and p.fits is True
    assert p.naive_tokens is not None and p.engine_tokens < p.naive_tokens
    assert p.engine_weights_gib is not None and p.naive_weights_gib is not None
    assert p.engine_weights_gib > p.naive_weights_gib  # embeddings + LM head stay bf16
    assert p.to_dict()["engine_tokens"] == p.engine_tokens == p.prediction.engine_tokens
    with pytest.raises(BadInput, match="x86-cpu has no fixed memory"):
        predict_for_arm(get_model("Llama-3-8B"), get_gpu("x86-cpu"), parse_arm_spec("fp8"), "vllm")


def test_vllm_kv_cache_memory_bytes_replaces_the_profile() -> None:
    """--kv-cache-memory-bytes 4 GiB on SmolLM2-135M (23,040 B/token bf16, 11,520 fp8): vLLM 0.25.0 on the H200
    logged 186,400 and 372,816 tokens (docs/gpu/h200-smollm2.md); blocks of 16 tokens, util ignored."""
    from quantrack.arms import make_arm
    from quantrack.hardware.capacity import predict_engine
    from quantrack.models.hub import resolve_model

    resolved = resolve_model("SmolLM2-135M")
    shape = getattr(resolved, "shape", resolved)
    for arm, logged in ((make_arm("bf16"), 186_400), (make_arm("fp8-kv", weights="fp8", kv="fp8"), 372_816)):
        for util in (0.45, 0.9):
            p = predict_engine(shape, 141 * 2**30, arm, "vllm", util=util, context_len=2048,
                               kv_cache_memory_bytes=4 * 2**30)
            assert p.engine_tokens == logged
    with pytest.raises(BadInput, match="--kv-cache-memory-bytes"):
        predict_engine(shape, 141 * 2**30, make_arm("bf16"), "sglang", util=0.5, kv_cache_memory_bytes=2**30)
