"""SGLang startup-log parser: the real H200 logs (SGLang 0.5.16) and lines filled in from the
f-strings quoted in ../shared/reference/engine-facts.md §1.3/§2 (citation beside each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.engines import detect_engine, get_adapter
from quantrack.engines.logparse import strip_prefix
from quantrack.engines.sglang import parse_server_info, parse_sglang_log

# exact figures read from the real logs
REAL = {
    "bf16": {"weights_gib": 14.98, "kv_cache_tokens": 906_163, "available_kv_gib": 110.62, "cuda_graph_gib": 1.71,
             "quantization": "none", "kv_cache_dtype": "bf16"},
    "fp8": {"weights_gib": 8.74, "kv_cache_tokens": 957_267, "available_kv_gib": 116.86, "cuda_graph_gib": 1.83,
            "quantization": "fp8", "kv_cache_dtype": "bf16"},
    "fp8kv": {"weights_gib": 8.74, "kv_cache_tokens": 1_914_535, "available_kv_gib": 116.86, "cuda_graph_gib": 1.86,
              "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
    "fp8marlin": {"weights_gib": 8.99, "kv_cache_tokens": 955_235, "available_kv_gib": 116.6,
                  "cuda_graph_gib": 1.66, "quantization": "fp8", "kv_cache_dtype": "bf16"},
}


@pytest.mark.parametrize("arm", sorted(REAL))
def test_real_h200_logs_exact_figures(shared_data: Path, arm: str) -> None:
    r = get_adapter("sglang").parse_log_file(shared_data / "sglang-h200" / f"sglang-0.5.16-{arm}.log")
    assert r.engine == "sglang"
    for field, value in REAL[arm].items():
        assert getattr(r, field) == value, field
    assert r.attention_backend == "triton"
    assert r.max_concurrency_context == 8192
    assert r.max_concurrency == round(REAL[arm]["kv_cache_tokens"] / 8192, 2)
    assert r.extra["derived"]["max_concurrency"] == "max_total_num_tokens / context_len"
    assert r.extra["mem_fraction_static"] == 0.903
    assert "engine_version" in r.not_found  # 0.5.16 does not print its version in the log


def test_rerun_log_gives_the_same_capacity(shared_data: Path) -> None:
    a = get_adapter("sglang").parse_log_file(shared_data / "sglang-h200" / "sglang-0.5.16-bf16.log")
    b = get_adapter("sglang").parse_log_file(shared_data / "sglang-h200" / "sglang-0.5.16-bf16-rerun-2026-11-30.log")
    assert a.kv_cache_tokens == b.kv_cache_tokens == 906_163


def test_fp8marlin_fallback_and_fp8kv_warning(shared_data: Path) -> None:
    m = get_adapter("sglang").parse_log_file(shared_data / "sglang-h200" / "sglang-0.5.16-fp8marlin.log")
    assert [(e.kind, e.line_no) for e in m.fallbacks] == [("fp8_marlin", 19)]
    k = get_adapter("sglang").parse_log_file(shared_data / "sglang-h200" / "sglang-0.5.16-fp8kv.log")
    assert [(e.kind, e.line_no) for e in k.warnings] == [("kv_scale_uncalibrated", 19)]
    assert k.fallbacks == []


@pytest.mark.parametrize("arm,tokens,kv", [("bf16", 906_163, "auto"), ("fp8kv", 1_914_535, "fp8_e4m3")])
def test_server_info_json(shared_data: Path, arm: str, tokens: int, kv: str) -> None:
    info = parse_server_info(json.loads((shared_data / "sglang-h200" / f"server-info-{arm}.json").read_text()))
    assert info["max_total_num_tokens"] == tokens
    assert info["kv_cache_dtype"] == kv
    assert info["engine_version"] == "0.5.16"
    assert parse_server_info([]) == {}


def test_tp_prefix_and_ranks_counted_once() -> None:
    # sglang@v0.5.23:python/sglang/srt/model_executor/model_runner.py:L1373-L1378 (Load weight end),
    # .../mem_cache/memory_pool.py:L2088-L2090 (KV Cache is allocated), printed once per TP rank;
    # .../managers/scheduler.py:L1269-L1275 (tp_rank 0 only); prefix form "[2026-02-27 17:10:27 TP0] " (brief)
    lines = []
    for rank in range(2):
        lines.append(f"[2026-02-27 17:10:27 TP{rank}] Load weight end. elapsed=5.10 s, type=LlamaForCausalLM, "
                     f"quant=fp8, avail mem=71.20 GB, mem usage={7.48 + rank:.2f} GB.")
        lines.append(f"[2026-02-27 17:10:28 TP{rank}] KV Cache is allocated. dtype: torch.float8_e4m3fn, "
                     f"#tokens: {500000 + rank}, K size: 30.52 GB, V size: 30.52 GB")
        lines.append(f"[2026-02-27 17:10:40 TP{rank}] Capture target decode CUDA graph end. bs=[1, 2, 4], "
                     "elapsed=3.00 s, mem usage=0.40 GB, avail mem=5.10 GB.")
    lines.append("[2026-02-27 17:10:41 TP0] max_total_num_tokens=500000, chunked_prefill_size=8192, "
                 "max_prefill_tokens=16384, max_running_requests=2048, context_len=4096, available_gpu_mem=5.10 GB")
    r = parse_sglang_log(lines)
    assert r.weights_gib == 7.48  # TP0's figure, not TP1's repeat
    assert r.quantization == "fp8" and r.kv_cache_dtype == "fp8_e4m3"
    assert r.kv_cache_tokens == 500_000 and r.available_kv_gib == 61.04
    assert r.cuda_graph_gib == 0.40  # the decode graph line of TP1 is not added again
    assert r.max_concurrency_context == 4096 and r.extra["max_running_requests"] == 2048
    assert strip_prefix("[2026-02-27 17:10:27 TP0] x") == ("x", None, "TP0")


def test_sglang_fallback_and_error_strings() -> None:
    lines = [
        # sglang@v0.5.23:.../load_model_utils.py:L80-L91
        "[2026-01-01 00:00:00] Compute capability below sm80. Use float16 due to lack of bfloat16 support.",
        # sglang@v0.5.23:python/sglang/srt/layers/quantization/awq/awq.py:L340-L353
        ("[2026-01-01 00:00:01] Detected that the model can run with awq_marlin, however you specified "
        "quantization=awq explicitly, so forcing awq. Use quantization=awq_marlin for faster inference"),
        # sglang@v0.5.23:python/sglang/srt/model_loader/loader.py:L259-L271
        ("[2026-01-01 00:00:02] ValueError: The quantization method fp8 is not supported for the current GPU. "
        "Minimum capability: 80. Current capability: 75."),
        # sglang@v0.5.23:.../mem_cache/kv_cache_configurator.py:L3043-L3058
        ("[2026-01-01 00:00:03] RuntimeError: Loaded weights leave no GPU memory for the KV cache under "
        "--mem-fraction-static=0.500. Raise --mem-fraction-static above 0.812 (minimum viable = 1 - "
        "available/pre = 0.7800). If using speculative decoding, draft weights are now counted."),
    ]
    r = parse_sglang_log(lines)
    assert [f.kind for f in r.fallbacks] == ["bf16_to_fp16", "awq_gptq_forced"]
    assert r.dtype == "fp16"
    kinds = [e.kind for e in r.errors]
    assert "min_capability_error" in kinds and "no_kv_memory" in kinds
    assert (r.extra["min_capability"], r.extra["current_capability"]) == (80, 75)


def test_detect_sglang(shared_data: Path) -> None:
    head = (shared_data / "sglang-h200" / "sglang-0.5.16-fp8.log").read_text()[:30000]
    assert detect_engine(head) == "sglang"


QWEN_H200 = Path(__file__).resolve().parents[1] / "data" / "sglang-qwen-h200"


def test_negative_mem_usage_on_a_shared_gpu_is_not_a_size() -> None:
    """quantrack's own H200 run (tests/data/sglang-qwen-h200): other servers released memory while this one loaded,
    so SGLang printed 'mem usage=-20.23 GB' at 'Load weight end' (and -65.17 GB after graph capture). The weights and
    graph sizes are unknown with the reason, never -20.23 GiB (which an earlier parser derived from begin - end)."""
    r = parse_sglang_log((QWEN_H200 / "sglang-0.5.16-qwen-fp8-marlin-shared-gpu.log").read_text(), source="marlin")
    assert r.weights_gib is None and "weights_gib" in r.not_found
    assert "mem usage=-20.23 GB" in r.extra["weights_gib_unknown"]
    assert r.cuda_graph_gib is None and "-65.17" in r.extra["cuda_graph_gib_unknown"]
    assert "weights_gib" not in r.extra.get("derived", {})
    assert r.kv_cache_tokens == 1_137_192  # what the log does establish is still read
    assert [f.kind for f in r.fallbacks] == ["fp8_marlin"]
    # the same line without the sign still gives the size
    line = ("[2026-12-02 03:24:17] Load weight end. elapsed=0.92 s, type=Qwen2ForCausalLM, avail mem=98.02 GB, "
            "mem usage=3.46 GB.")
    assert parse_sglang_log(line, source="ok").weights_gib == 3.46


def test_free_memory_rising_between_begin_and_end_is_not_derived_as_weights() -> None:
    """SGLang <= 0.2 printed no mem usage: weights = free before - free after, unless free memory rose."""
    lines = ("[12:00:00 TP0] Load weight begin. avail mem=51.08 GB\n"
             "[12:00:11 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=71.31 GB\n")
    r = parse_sglang_log(lines, source="old")
    assert r.weights_gib is None and "51.08 -> 71.31" in r.extra["weights_gib_unknown"]


def test_scales_file_on_triton_fails_at_graph_capture() -> None:
    """The kv-fp8-scales-file arm: SGLang loaded the file's scales, then failed capturing decode graphs."""
    r = parse_sglang_log((QWEN_H200 / "sglang-0.5.16-qwen-kv-scales-file-triton.log").read_text(), source="sf")
    assert r.kv_scales["source"] == "checkpoint"  # what the log said before the failure
    assert r.errors, "the TypeError is reported as an error"


def test_logs_parse_says_unknown_not_blank_for_a_negative_mem_usage() -> None:
    import json

    from click.testing import CliRunner

    from quantrack.cli import cli

    log = str(QWEN_H200 / "sglang-0.5.16-qwen-fp8-marlin-shared-gpu.log")
    res = CliRunner().invoke(cli, ["logs", "parse", log, "--format", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)[0]
    assert rep["weights_gib"] is None and "mem usage=-20.23 GB" in rep["extra"]["weights_gib_unknown"]
    res = CliRunner().invoke(cli, ["logs", "parse", log])
    assert res.exit_code == 0 and "unknown" in res.output and "-20.23" not in res.output, res.output
