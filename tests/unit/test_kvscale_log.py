"""After launch: the KV scales an engine used, read from its own lines (quantrack.engines.kvscale).

Real logs: tests/data/logs/h200-default (vLLM 0.25.0 / SGLang 0.5.16, FP8 weights + FP8 KV) and tests/data/kvscale
(FP8 KV on bf16 weights, quantrack's own H200 runs; provenance in its README). Lines no real log holds are filled in
from the format strings read in the engine code, each cited where it is used.
"""

from __future__ import annotations

from pathlib import Path

from quantrack.engines import get_adapter, parse_log_file
from quantrack.engines.kvplan import ScaleSource
from quantrack.engines.kvscale import KVScaleObservation

DATA = Path(__file__).resolve().parents[1] / "data"
H200 = DATA / "logs" / "h200-default"
KV = DATA / "kvscale"


def scan_file(path: Path, engine: str) -> KVScaleObservation:
    """The observation the engine's own parser records for a log file (LogReport.kv_scales)."""
    return _obs(parse_log_file(path, engine).kv_scales)


def scan_lines(lines: list[str], engine: str) -> KVScaleObservation:
    """The same for lines given as text (the adapter's parse_log, the runner's in-memory path)."""
    return _obs(get_adapter(engine).parse_log("\n".join(lines)).kv_scales)


def _obs(d: dict | None) -> KVScaleObservation:
    assert d is not None
    return KVScaleObservation(ScaleSource(d["source"]), d["reason"], d["kv_dtype"], d["evidence"])


def lines(*texts: str) -> list[str]:
    return list(texts)


def test_vllm_fp8_weights_fp8_kv_real_log() -> None:
    o = scan_file(H200 / "vllm-0.25.0-fp8kv.log", "vllm")
    assert o is not None and o.source == ScaleSource.UNSCALED and o.kv_dtype == "fp8"
    assert [(e["line_no"], e["kind"]) for e in o.evidence] == [(38, "unscaled"), (37, "q_missing"),
                                                              (39, "q_uncalibrated")]
    assert o.evidence[0]["line"].startswith("Using KV cache scaling factor 1.0 for fp8_e4m3.")
    assert o.evidence_text("vllm.log") == (
        "vllm.log:38: Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale "
        "scaling factors are properly set in the checkpoint.")


def test_vllm_fp8_kv_on_bf16_weights_prints_no_scale_line_real_log() -> None:
    o = scan_file(KV / "vllm-0.25.0-smollm2-kv-fp8-bf16-weights.head.log", "vllm")
    assert o is not None and o.source == ScaleSource.UNSCALED and o.evidence == []
    assert "quantization=None" in o.reason and "prints no scale line" in o.reason


def test_sglang_real_logs() -> None:
    for path, line in ((H200 / "sglang-0.5.16-fp8kv.log", 19),
                       (KV / "sglang-0.5.16-smollm2-kv-fp8-bf16-weights.head.log", 21)):
        o = scan_file(path, "sglang")
        assert o is not None and o.source == ScaleSource.UNSCALED and o.kv_dtype == "float8_e4m3fn"
        assert o.evidence[0]["line_no"] == line
        assert o.evidence[0]["line"].startswith("Using FP8 KV cache but no scaling factors provided.")
        assert "--quantization-param-path" in o.reason


def test_unquantized_kv_real_logs() -> None:
    for name, engine in (("vllm-0.25.0-bf16.log", "vllm"), ("vllm-0.25.0-fp8.log", "vllm"),
                         ("sglang-0.5.16-bf16.log", "sglang"), ("sglang-0.5.16-fp8.log", "sglang")):
        o = scan_file(H200 / name, engine)
        assert o is not None and o.source == ScaleSource.NOT_QUANTIZED, name


def test_file_and_lines_paths_agree() -> None:
    # the engines' own single pass (quantrack.engines.logparse), from a file or from lines
    for path, engine in ((H200 / "vllm-0.25.0-fp8kv.log", "vllm"), (H200 / "sglang-0.5.16-fp8kv.log", "sglang"),
                         (KV / "vllm-0.25.0-smollm2-kv-fp8-bf16-weights.head.log", "vllm"),
                         (KV / "sglang-0.5.16-smollm2-kv-fp8-bf16-weights.head.log", "sglang"),
                         (H200 / "vllm-0.25.0-bf16.log", "vllm")):
        rep = parse_log_file(path)
        text = get_adapter(engine).parse_log(path.read_bytes().split(b"\n"))
        assert rep.kv_scales is not None and text.kv_scales is not None
        assert rep.kv_scales == text.kv_scales, path
        assert "_kv_scale_lines" not in rep.extra
    rep = parse_log_file(H200 / "vllm-0.25.0-fp8kv.log")
    assert rep.kv_scales is not None and rep.kv_scales["source"] == "1.0"
    f16 = parse_log_file(DATA / "logs" / "xllamacpp-SmolLM2-Q8_0-np1.log").kv_scales
    assert f16 is not None and f16["source"] == "not-quantized" and "K (f16), V (f16)" in f16["reason"]
    q8 = parse_log_file(DATA / "logs" / "xllamacpp-SmolLM2-Q4_0-np2-kvq8_0.log").kv_scales
    assert q8 is not None and q8["source"] == "dynamic-per-block" and q8["kv_dtype"] == "q8_0"


def test_vllm_calculate_kv_scales_deprecation() -> None:
    # vllm@dd10e03f9:vllm/config/cache.py:L263-L273 (logger.warning, the string as printed)
    o = scan_lines(lines(
        "(APIServer pid=7) WARNING 12-01 10:00:00 [cache.py:267] The `--calculate-kv-scales` option is deprecated "
        "and will be removed in v0.19. The scales will be loaded from the model checkpoint if available, otherwise "
        "they default to 1.0.",
        "(APIServer pid=7) INFO 12-01 10:00:00 [cache.py:286] Using fp8 data type to store kv cache. It reduces the "
        "GPU memory footprint and boosts the performance. Meanwhile, it may cause accuracy drop without a proper "
        "scaling factor"), "vllm")
    assert o.source == ScaleSource.COMPUTED and o.evidence[0]["line_no"] == 1


def test_vllm_per_token_head_and_e5m2_refusal() -> None:
    # vllm@dd10e03f9:vllm/config/cache.py:L279-L285 ("Using %s data type ... Dynamic per-token-head scales ...")
    o = scan_lines(lines(
        "(APIServer pid=7) INFO 12-01 10:00:00 [cache.py:280] Using fp8_per_token_head data type to store kv cache. "
        "It reduces the GPU memory footprint and boosts the performance. Dynamic per-token-head scales will be "
        "computed at runtime."), "vllm")
    assert (o.source, o.kv_dtype) == (ScaleSource.DYNAMIC_PER_TOKEN_HEAD, "fp8_per_token_head")
    # vllm@dd10e03f9:vllm/model_executor/layers/attention/attention.py:L210-L212 (raised ValueError, in the traceback)
    o = scan_lines(lines("(EngineCore pid=9) ERROR 12-01 10:00:05 [core.py:900] ValueError: fp8_e5m2 kv-cache is "
                         "not supported with fp8 checkpoints."), "vllm")
    assert o.source == ScaleSource.REFUSED


def test_vllm_silent_checkpoint_scales_and_dropped_names() -> None:
    banner = ("(EngineCore pid=2) INFO 12-01 10:00:01 [core.py:114] Initializing a V1 LLM engine (v0.25.0) with config: "
              "model='/m', dtype=torch.bfloat16, quantization=compressed-tensors, quantization_config=None, "
              "kv_cache_dtype=fp8, device_config=cuda")
    # the banner alone: the log stops before the weights are processed, where the scale warning is printed, so the
    # warning's absence proves nothing (issue 41: "absence taken as proof")
    o = scan_lines(lines(banner), "vllm")
    assert o.source == ScaleSource.UNKNOWN and "its absence proves nothing" in o.reason
    # past the weight loading ("Model loading took %.4f GiB and %.6f seconds", vLLM's gpu_model_runner.py load_model)
    loaded = ("(EngineCore pid=2) INFO 12-01 10:00:05 [gpu_model_runner.py:1793] Model loading took 7.5083 GiB and "
              "3.120000 seconds")
    o = scan_lines(lines(banner, loaded), "vllm")
    assert o.source == ScaleSource.CHECKPOINT and "quantization=compressed-tensors" in o.reason
    # vllm@dd10e03f9:vllm/model_executor/model_loader/weight_utils.py:L1438-L1444
    dropped = ("(EngineCore pid=2) WARNING 12-01 10:00:02 [weight_utils.py:1438] Found k_scale in the checkpoint "
               "(e.g. model.layers.0.self_attn.k_proj.k_scale), but not found the expected name in the model (e.g. "
               "model.layers.0.self_attn.attn.k_scale). k_scale is not loaded.")
    warn = ("(EngineCore pid=2) WARNING 12-01 10:00:03 [kv_cache.py:148] Using KV cache scaling factor 1.0 for "
            "fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are properly set in the checkpoint.")
    o = scan_lines(lines(banner, dropped, warn), "vllm")
    assert o.source == ScaleSource.UNSCALED and "present but not loaded" in o.reason
    assert [e["kind"] for e in o.evidence] == ["unscaled", "checkpoint_scale_not_loaded"]


def test_sglang_loaded_and_qwen2_dropped() -> None:
    # sglang@v0.5.16:python/sglang/srt/model_executor/model_runner_components/load_model_utils.py:L92-L96
    o = scan_lines(lines("[2026-12-01 10:00:00] Loaded KV cache scaling factors from /root/kv_scales.json",
                         "[2026-12-01 10:00:01] KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: 100, "
                         "K size: 1.00 GB, V size: 1.00 GB"), "sglang")
    assert (o.source, o.kv_dtype) == (ScaleSource.CHECKPOINT, "float8_e4m3fn")
    # sglang@v0.5.16:python/sglang/srt/models/qwen2.py:L639 (f"Parameter {name} not found in params_dict"), then
    # load_model_utils.py:L103-L108
    o = scan_lines(lines(
        "[2026-12-01 10:00:00] Parameter model.layers.0.self_attn.k_scale not found in params_dict",
        "[2026-12-01 10:00:01] Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of "
        "1.0. This may lead to less accurate results!"), "sglang")
    assert o.source == ScaleSource.UNSCALED and "present but not loaded" in o.reason


def test_no_kv_line_at_all_is_unknown() -> None:
    o = scan_lines(lines("[2026-12-01 10:00:00] something else"), "sglang")
    assert o.source == ScaleSource.UNKNOWN and "no KV dtype" in o.reason


def test_real_vllm_e5m2_on_triton_attn_start_failure_is_a_refusal() -> None:
    """quantrack's own H200 run (tests/data/kvscale/README.md): vLLM 0.25.0 with fp8_e5m2 KV on TRITON_ATTN failed at
    start on its query quantizer's assert; the log reads as a refusal, not as 'scales 1.0'."""
    path = KV / "vllm-0.25.0-qwen2-kv-fp8-e5m2-triton.log"
    o = scan_file(path, "vllm")
    assert o.source == ScaleSource.REFUSED, o
    rep = parse_log_file(path, engine="vllm")
    assert rep.extra.get("startup_failed") is True and rep.kv_cache_tokens is None
