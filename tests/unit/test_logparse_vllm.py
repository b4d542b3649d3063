"""vLLM startup-log parser: the real H200 logs (vLLM 0.25.0) and older formats.

Lines not taken from ../shared/data are either real lines quoted in public issues (URL beside
them) or filled in from the format strings in ../shared/reference/engine-facts.md (citation beside).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.engines import detect_engine, get_adapter
from quantrack.engines.logparse import parse_number, strip_prefix
from quantrack.engines.vllm import parse_metrics, parse_models, parse_vllm_log


def _parse(path: Path):  # type: ignore[no-untyped-def]
    return get_adapter("vllm").parse_log_file(path)


# exact figures read from the real logs (grep the files to see them)
REAL = {
    "bf16": {"weights_gib": 14.96, "available_kv_gib": 112.33, "kv_cache_tokens": 920_192, "max_concurrency": 112.33,
                 "cuda_graph_gib": 0.98, "quantization": "none", "kv_cache_dtype": "auto", "linear_kernel": None},
    "fp8": {"weights_gib": 8.5, "available_kv_gib": 118.76, "kv_cache_tokens": 972_864, "max_concurrency": 118.76,
                "cuda_graph_gib": 0.90, "quantization": "fp8", "kv_cache_dtype": "auto",
                "linear_kernel": "CutlassFP8ScaledMMLinearKernel"},
    "fp8kv": {"weights_gib": 8.5, "available_kv_gib": 118.76, "kv_cache_tokens": 1_945_728, "max_concurrency": 237.52,
                  "cuda_graph_gib": 0.90, "quantization": "fp8", "kv_cache_dtype": "fp8",
                  "linear_kernel": "CutlassFP8ScaledMMLinearKernel"},
    "fp8marlin": {"weights_gib": 8.49, "available_kv_gib": 118.79, "kv_cache_tokens": 973_168, "max_concurrency": 118.79,
                      "cuda_graph_gib": 0.67, "quantization": "fp8", "kv_cache_dtype": "auto",
                      "linear_kernel": "MarlinFP8ScaledMMLinearKernel"},
}


@pytest.mark.parametrize("arm", sorted(REAL))
def test_real_h200_logs_exact_figures(shared_data: Path, arm: str) -> None:
    r = _parse(shared_data / "vllm-h200" / f"vllm-0.25.0-{arm}.log")
    assert r.engine == "vllm"
    assert r.engine_version == "0.25.0"
    for field, value in REAL[arm].items():
        assert getattr(r, field) == value, field
    assert r.max_concurrency_context == 8192
    assert r.attention_backend == "FLASH_ATTN"
    assert r.dtype == "bf16"
    assert r.gpu is None and "gpu" in r.not_found  # the 0.25 logs never print the GPU name


def test_fp8marlin_fallback_with_line_number(shared_data: Path) -> None:
    r = _parse(shared_data / "vllm-h200" / "vllm-0.25.0-fp8marlin.log")
    assert [(e.kind, e.line_no) for e in r.fallbacks] == [("fp8_marlin", 29)]
    assert "Weight-only FP8 compression will be used leveraging the Marlin kernel" in r.fallbacks[0].line
    assert r.extra["linear_method"] == "Fp8PerTensorOnlineLinearMethod"
    assert r.fell_back


def test_fp8_cutlass_has_no_fallback(shared_data: Path) -> None:
    r = _parse(shared_data / "vllm-h200" / "vllm-0.25.0-fp8.log")
    assert r.fallbacks == [] and r.errors == []


def test_fp8kv_uncalibrated_scale_warning(shared_data: Path) -> None:
    r = _parse(shared_data / "vllm-h200" / "vllm-0.25.0-fp8kv.log")
    kinds = {e.kind: e.line_no for e in r.warnings}
    assert kinds["kv_scale_uncalibrated"] == 38
    assert kinds["q_scale_uncalibrated"] == 39
    assert kinds["q_scale_missing"] == 37


def test_bench_latency_log(shared_data: Path) -> None:
    r = _parse(shared_data / "vllm-h200" / "vllm-bench-latency-bf16.log")
    assert (r.kv_cache_tokens, r.available_kv_gib, r.weights_gib) == (914_672, 111.66, 14.96)


def test_metrics_cache_config_info(shared_data: Path) -> None:
    m = parse_metrics((shared_data / "vllm-h200" / "metrics-fp8kv.txt").read_text())
    assert m["kv_cache_size_tokens"] == 1_945_728
    assert m["num_gpu_blocks"] == 121_608 and m["block_size"] == 16
    assert m["cache_dtype"] == "fp8"
    assert m["kv_cache_max_concurrency"] == pytest.approx(237.515625)
    assert parse_metrics((shared_data / "vllm-h200" / "metrics-bf16.txt").read_text())["cache_dtype"] == "auto"


def test_models_json() -> None:
    assert parse_models({"object": "list", "data": [{"id": "m", "max_model_len": 8192, "root": "/r"}]}) == \
        {"model": "m", "max_model_len": 8192, "root": "/r"}
    assert parse_models({"data": []}) == {}


def test_prefix_stripping() -> None:
    # real line, vllm-0.25.0-bf16.log:32
    text, level, proc = strip_prefix(
        "(EngineCore pid=885) INFO 11-29 10:39:10 [model_runner.py:302] Model loading took 14.96 GiB and 4.347068 seconds")
    assert (text, level, proc) == ("Model loading took 14.96 GiB and 4.347068 seconds", "INFO", "EngineCore pid=885")
    # the brief's form with a DP tag, no process tag at all, and a v0 line without brackets around the source
    assert strip_prefix("(EngineCore_DP0 pid=7) INFO 09-10 13:29:13 [gpu_worker.py:123] x")[0] == "x"
    assert strip_prefix("WARNING 11-29 10:45:20 [marlin_utils_fp8.py:112] y") == ("y", "WARNING", None)
    # v0 form, https://github.com/vllm-project/vllm/pull/6234
    assert strip_prefix("INFO 07-17 23:41:28 distributed_gpu_executor.py:56] # GPU blocks: 10039, # CPU blocks: 1310") \
        == ("# GPU blocks: 10039, # CPU blocks: 1310", "INFO", None)


def test_thousands_separators() -> None:
    assert parse_number("1,945,728") == 1_945_728
    assert parse_number("8,192") == 8192
    assert parse_number("118.79") == 118.79
    assert parse_number("237.52x") == 237.52
    assert parse_number("1,94") is None and parse_number("abc") is None


def test_v033_combined_capacity_line() -> None:
    # vllm@4ba787ec9:vllm/v1/core/kv_cache_utils.py:L1148-L1149
    #   "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx" (tokens as f"{n:,}")
    # vllm@4ba787ec9:vllm/v1/worker/gpu_model_runner.py:L5089 "Model loading took %s GiB memory and %.6f seconds"
    # vllm@4ba787ec9:vllm/v1/worker/gpu_worker.py:L773 "Available KV cache memory: %s GiB"
    # vllm@4ba787ec9:vllm/v1/worker/gpu_model_runner.py:L6517 "Graph capturing finished in %.0f secs, took %.2f GiB"
    # vllm@4ba787ec9:vllm/platforms/cuda.py:L509 "Using %s attention backend out of potential backends: %s."
    log = [
        ("(EngineCore_DP0 pid=11) INFO 01-02 03:04:05 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with "
        "config: model='m', dtype=torch.bfloat16, max_seq_len=4096, quantization=fp8, kv_cache_dtype=fp8_e4m3, x=1"),
        ("(EngineCore_DP0 pid=11) INFO 01-02 03:04:06 [cuda.py:509] Using FLASHINFER attention backend out of "
        "potential backends: ['FLASHINFER', 'TRITON_ATTN']."),
        ("(EngineCore_DP0 pid=11) INFO 01-02 03:04:07 [gpu_model_runner.py:5089] Model loading took 7.48 GiB memory "
        "and 12.345678 seconds"),
        "(EngineCore_DP0 pid=11) INFO 01-02 03:04:08 [gpu_worker.py:773] Available KV cache memory: 59.1 GiB",
        ("(EngineCore_DP0 pid=11) INFO 01-02 03:04:08 [kv_cache_utils.py:1148] GPU KV cache size: 968,304 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 236.40x"),
        ("(EngineCore_DP0 pid=11) INFO 01-02 03:04:09 [gpu_model_runner.py:6517] Graph capturing finished in 4 secs, "
        "took 0.52 GiB"),
    ]
    r = parse_vllm_log(log)
    assert r.engine_version == "0.33.0" and r.quantization == "fp8" and r.kv_cache_dtype == "fp8_e4m3"
    assert (r.weights_gib, r.available_kv_gib, r.kv_cache_tokens) == (7.48, 59.1, 968_304)
    assert (r.max_concurrency, r.max_concurrency_context, r.cuda_graph_gib) == (236.40, 4096, 0.52)
    assert r.attention_backend == "FLASHINFER"


def test_v011_legacy_lines() -> None:
    # vllm@f71952c1c:vllm/v1/worker/gpu_model_runner.py:L2653 "Model loading took %.4f GiB and %.6f seconds"
    # vllm@f71952c1c:vllm/v1/core/kv_cache_utils.py:L1087 "GPU KV cache size: %s tokens"
    # vllm@f71952c1c:vllm/v1/core/kv_cache_utils.py:L1091 "Maximum concurrency for %s tokens per request: %.2fx"
    # vllm@f71952c1c:vllm/platforms/cuda.py:L325 "Using Flash Attention backend on V1 engine."
    log = [
        "INFO 10-01 10:00:00 [cuda.py:325] Using Flash Attention backend on V1 engine.\n",
        "INFO 10-01 10:00:01 [gpu_model_runner.py:2653] Model loading took 14.9888 GiB and 3.500000 seconds\n",
        "INFO 10-01 10:00:02 [kv_cache_utils.py:1087] GPU KV cache size: 441,232 tokens\n",
        "INFO 10-01 10:00:02 [kv_cache_utils.py:1091] Maximum concurrency for 131,072 tokens per request: 3.37x\n",
    ]
    r = parse_vllm_log(log)
    assert (r.weights_gib, r.kv_cache_tokens, r.max_concurrency, r.max_concurrency_context) == \
        (14.9888, 441_232, 3.37, 131_072)
    assert r.attention_backend == "Flash Attention"


def test_v0_blocks_and_tp_repeats_counted_once() -> None:
    # real lines, https://github.com/vllm-project/vllm/pull/6234 (TP=4: each worker repeats the weights line)
    log = [
        "(VllmWorkerProcess pid=6923) INFO 07-17 23:41:16 model_runner.py:559] Loading model weights took 6.1138 GB",
        "(VllmWorkerProcess pid=6922) INFO 07-17 23:41:16 model_runner.py:559] Loading model weights took 6.1138 GB",
        "INFO 07-17 23:41:28 distributed_gpu_executor.py:56] # GPU blocks: 10039, # CPU blocks: 1310",
    ]
    r = parse_vllm_log(log)
    assert r.weights_gib == 6.1138
    assert r.extra["num_gpu_blocks"] == 10039 and r.extra["num_cpu_blocks"] == 1310
    assert r.kv_cache_tokens == 10039 * 16  # derived: blocks x default block size, labelled
    assert "kv_cache_tokens" in r.extra["derived"]


def test_v0_memory_profiling_table() -> None:
    # real lines, https://github.com/vllm-project/vllm/pull/14447 (printed by every worker: counted once)
    line = ("(VllmWorkerProcess pid={p}) INFO 04-12 08:21:19 [worker.py:267] model weights take 21.21GiB; "
            "non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 0.37GiB; the rest of the memory "
            "reserved for KV Cache is 1.57GiB.")
    total = ("(VllmWorkerProcess pid=507) INFO 04-12 08:21:19 [worker.py:267] the current vLLM instance can use "
             "total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.99) = 23.35GiB")
    r = parse_vllm_log([total, line.format(p=521), line.format(p=507)])
    assert (r.weights_gib, r.available_kv_gib) == (21.21, 1.57)
    assert r.extra["total_gpu_memory_gib"] == 23.58 and r.extra["gpu_memory_utilization"] == 0.99


def test_errors_and_fallbacks_from_format_strings() -> None:
    lines = [
        # real line, https://github.com/vllm-project/vllm/issues/2418
        ("ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
        "in KV cache (3664). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."),
        # vllm@4ba787ec9:vllm/config/vllm.py:L930-L943
        ("ERROR 01-01 00:00:00 [core.py:1] The quantization method fp8 is not supported for the current GPU. "
        "Minimum capability: 80. Current capability: 75."),
        # vllm@4ba787ec9:vllm/platforms/cuda.py:L650-L655
        ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU "
        "has compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in CLI, "
        "for example: --dtype=half."),
        # vllm@4ba787ec9:vllm/config/model.py:L2457-L2462
        ("WARNING 01-01 00:00:00 [model.py:2457] Your device 'Tesla T4' (with compute capability 7.5) doesn't "
        "support torch.bfloat16. Falling back to torch.float16 for compatibility."),
        # vllm@f71952c1c:vllm/model_executor/layers/quantization/awq_marlin.py:L117-L127
        ("INFO 01-01 00:00:00 [awq_marlin.py:117] Detected that the model can run with awq_marlin, however you "
        "specified quantization=awq explicitly, so forcing awq. Use quantization=awq_marlin for faster inference"),
        # vllm@4ba787ec9:.../quantization/auto_awq.py:L326
        ("WARNING 01-01 00:00:00 [auto_awq.py:326] Layer 'lm_head' is not supported by AutoAWQMarlin. Falling back "
        "to unoptimized AWQ kernels."),
        # vllm@4ba787ec9:vllm/model_executor/kernels/linear/nvfp4/marlin.py:L35
        ("WARNING 01-01 00:00:00 [marlin.py:35] Your GPU does not have native support for FP4 computation but "
        "FP4 quantization is being used."),
    ]
    r = parse_vllm_log(lines)
    errors = {e.kind: e.line_no for e in r.errors}
    assert errors["max_model_len_exceeds_kv"] == 1
    assert errors["min_capability_error"] == 2
    assert errors["bf16_unsupported_error"] == 3
    assert r.extra["kv_tokens_limit"] == 3664 and r.extra["max_model_len"] == 4096
    assert (r.extra["min_capability"], r.extra["current_capability"]) == (80, 75)
    assert r.gpu == "Tesla T4"
    assert [f.kind for f in r.fallbacks] == ["bf16_to_fp16", "awq_gptq_forced", "layer_unoptimized_fallback",
                                             "fp4_marlin"]


def test_detect_vllm(shared_data: Path) -> None:
    head = (shared_data / "vllm-h200" / "vllm-0.25.0-bf16.log").read_text()[:20000]
    assert detect_engine(head) == "vllm"


def test_cli_logs_parse_json_field_names(shared_data: Path) -> None:
    import json

    from click.testing import CliRunner

    from quantrack.cli import cli

    log = shared_data / "vllm-h200" / "vllm-0.25.0-fp8marlin.log"
    res = CliRunner().invoke(cli, ["logs", "parse", str(log), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert isinstance(data, list) and len(data) == 1
    for key in ("engine", "engine_version", "gpu", "weights_gib", "available_kv_gib", "kv_cache_tokens",
                "max_concurrency", "max_concurrency_context", "cuda_graph_gib", "quantization", "linear_kernel",
                "attention_backend", "kv_cache_dtype", "dtype", "extra", "fallbacks", "warnings", "errors",
                "not_found"):
        assert key in data[0]
    assert data[0]["fallbacks"][0] == {"kind": "fp8_marlin", "line_no": 29, "line": data[0]["fallbacks"][0]["line"]}
    assert data[0]["kv_cache_tokens"] == 973_168


def test_cli_logs_reconcile(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from click.testing import CliRunner

    from quantrack.cli import cli

    log = shared_data / "vllm-h200" / "vllm-0.25.0-fp8kv.log"
    res = CliRunner().invoke(cli, ["logs", "reconcile", str(log), "--model", "Llama-3.1-8B", "--gpu", "H200",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["arm"]["weights"] == "fp8" and out["arm"]["kv"] == "fp8"  # inferred from the log
    rows = {r["figure"]: r for r in out["rows"]}
    assert rows["kv_cache_tokens"]["log"] == 1_945_728
    tokens = rows["kv_cache_tokens"]
    assert tokens["error_pct"] == round(100 * (tokens["predicted"] - 1_945_728) / 1_945_728, 2)
    assert out["basis"] == {"predicted": "derived", "log": "measured (engine log)"}
    from quantrack.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["logs", "reconcile", str(log), "--model", "Llama-3.1-8B"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("quantrack: error: --gpu is required for a GPU engine's log "
                                       "(e.g. --gpu H200)\n")


def test_non_default_args_give_the_memory_setting_and_scheduler_limits() -> None:
    """Real vLLM 0.25.0 log taken at --gpu-memory-utilization 0.45 (second H200 session)."""
    log = Path(__file__).resolve().parents[1] / "data" / "logs" / "h200-util045" / "vllm-0.25.0-bf16.log"
    r = parse_vllm_log(log.read_text(encoding="utf-8").splitlines())
    assert r.extra["gpu_memory_utilization"] == 0.45
    assert r.kv_cache_tokens == 381_920 and r.available_kv_gib == 46.62
    assert "max_num_seqs" not in r.extra  # not given, so not in the non-default args
    line = ("(APIServer pid=7) INFO 11-30 12:28:11 [api_utils.py:273] non-default args: {'model': '/m', "
            "'max_num_batched_tokens': 4096, 'max_num_seqs': 64, 'gpu_memory_utilization': 0.8}")
    r = parse_vllm_log([line])
    assert (r.extra["max_num_batched_tokens"], r.extra["max_num_seqs"], r.extra["gpu_memory_utilization"]) == (
        4096, 64, 0.8)
