"""llama.cpp startup-log parser: the real xllamacpp CPU logs, a log captured here (tests/data/logs),
plain (untimestamped) lines and format strings from ../shared/reference/engine-facts.md §1.4."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.engines import detect_engine, get_adapter
from quantrack.engines.llamacpp import (
    parse_llamacpp_log,
    parse_llamacpp_metrics,
    parse_props,
    parse_slots,
)
from quantrack.engines.logparse import strip_prefix

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"

REAL = {  # file -> (file type, file MiB, BPW, KV MiB, K type, K MiB)
    "xllamacpp-F16-kvf16.log": ("F16", 256.63, 16.00, 45.00, "f16", 22.50),
    "xllamacpp-Q8_0-kvf16.log": ("Q8_0", 136.40, 8.51, 45.00, "f16", 22.50),
    "xllamacpp-Q8_0-kvq8_0.log": ("Q8_0", 136.40, 8.51, 23.91, "q8_0", 11.95),
    "xllamacpp-Q4_0-kvf16.log": ("Q4_0", 72.27, 4.51, 45.00, "f16", 22.50),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_cpu_logs_exact_figures(shared_data: Path, name: str) -> None:
    ftype, mib, bpw, kv_mib, ktype, k_mib = REAL[name]
    r = get_adapter("llamacpp").parse_log_file(shared_data / "llamacpp-cpu" / name)
    assert r.engine == "llamacpp" and r.engine_version == "b0-unknown"
    assert r.quantization == ftype and r.extra["file_type"] == ftype
    assert (r.extra["file_size_mib"], r.extra["bpw"]) == (mib, bpw)
    assert r.extra["kv_mib"] == kv_mib and r.available_kv_gib == round(kv_mib / 1024, 4)
    assert (r.extra["k_type"], r.extra["k_mib"], r.extra["v_type"], r.extra["v_mib"]) == (ktype, k_mib, ktype, k_mib)
    assert (r.extra["kv_cells"], r.extra["kv_layers"], r.extra["kv_seqs"], r.extra["kv_streams"]) == (2048, 30, 1, 1)
    assert r.kv_cache_tokens == 2048 and r.kv_cache_dtype == ktype
    assert (r.max_concurrency, r.max_concurrency_context) == (1.0, 2048)
    assert r.extra["model_buffers_mib"]["CPU_Mapped"] == mib
    assert r.attention_backend == "flash_attn"  # auto resolved: "resolve_fused_ops: Flash Attention enabled"
    assert r.not_found == [] and r.fallbacks == [] and r.errors == []


def test_q4_0_repack_buffer(shared_data: Path) -> None:
    r = get_adapter("llamacpp").parse_log_file(shared_data / "llamacpp-cpu" / "xllamacpp-Q4_0-kvf16.log")
    assert r.extra["model_buffers_mib"] == {"CPU_Mapped": 72.27, "CPU_REPACK": 72.14}
    assert r.extra["tensor_types"] == {"f32": 61, "q4_0": 211}


def test_q8_kv_flash_attn_enabled(shared_data: Path) -> None:
    r = get_adapter("llamacpp").parse_log_file(shared_data / "llamacpp-cpu" / "xllamacpp-Q8_0-kvq8_0.log")
    assert r.extra["flash_attn"] == "enabled"


def test_captured_log_two_slots() -> None:
    # captured here: SmolLM2 Q4_0 (requantized by quantrack.models.gguf), -c 1024 -np 2, K/V q8_0, -fa on
    r = get_adapter("llamacpp").parse_log_file(DATA / "xllamacpp-SmolLM2-Q4_0-np2-kvq8_0.log")
    assert r.quantization == "Q4_0" and r.extra["file_size_mib"] == 72.27 and r.extra["bpw"] == 4.51
    assert (r.extra["kv_cells"], r.extra["kv_seqs"], r.extra["kv_streams"]) == (512, 2, 2)
    assert r.kv_cache_tokens == 1024  # 512 cells per stream x 2 streams
    assert (r.extra["kv_mib"], r.extra["k_mib"], r.extra["v_mib"]) == (11.95, 5.98, 5.98)
    assert (r.max_concurrency, r.max_concurrency_context) == (2.0, 512)


def test_plain_lines_without_timestamps() -> None:
    # llama.cpp@0c1e57098 format strings (engine-facts §1.4), printed without the server's timestamp:
    #   src/llama-model-loader.cpp:L1805 "%s: file type   = %s", L1809 "%s: file size   = %.2f GiB (%.2f BPW) "
    #   src/llama-model.cpp:L1930 "%s: %12s model buffer size = %8.2f MiB"
    #   src/llama-kv-cache.cpp:L301 "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, ..."
    #   ggml/src/ggml-cuda/ggml-cuda.cu:L345 "  Device %d: %s, compute capability %d.%d, VMM: %s, VRAM: %zu MiB"
    lines = [
        "  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes, VRAM: 24080 MiB",
        "print_info: file type   = Q4_K - Medium",
        "print_info: file size   = 4.58 GiB (4.89 BPW) ",
        "load_tensors:        CUDA0 model buffer size =  4403.49 MiB",
        "load_tensors:   CPU_Mapped model buffer size =   281.81 MiB",
        ("llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, "
        "V (f16):  512.00 MiB"),
    ]
    r = parse_llamacpp_log(lines)
    assert r.gpu == "NVIDIA GeForce RTX 4090" and r.extra["compute_capability"] == "8.9"
    assert r.quantization == "Q4_K" and r.extra["file_type"] == "Q4_K - Medium"
    assert r.extra["file_size_mib"] == round(4.58 * 1024, 2)
    assert r.extra["model_buffers_mib"] == {"CUDA0": 4403.49, "CPU_Mapped": 281.81}
    assert (r.kv_cache_tokens, r.extra["kv_mib"]) == (8192, 1024.0)


def test_gguf_fallback_quantization_warning() -> None:
    # real line, quoted in ikawrakow/ik_llama.cpp discussions (llama.cpp src/llama-quant.cpp format string
    # "%s: WARNING: %d of %d tensor(s) required fallback quantization\n")
    r = parse_llamacpp_log(["llama_model_quantize_internal: WARNING: 54 of 54 tensor(s) required fallback quantization"])
    assert [(f.kind, f.line_no) for f in r.fallbacks] == [("gguf_fallback_quantization", 1)]
    assert r.extra["fallback_tensors"] == 54


def test_quantized_v_cache_without_flash_attn_is_an_error() -> None:
    # llama.cpp@0c1e57098:src/llama-context.cpp:L3840-L3848 "%s: quantized V cache requires flash_attn to be enabled\n"
    r = parse_llamacpp_log(["0.00.100.000 E llama_init_from_model: quantized V cache requires flash_attn to be enabled"])
    assert [e.kind for e in r.errors] == ["quantized_v_cache_needs_flash_attn"]


def test_prefix() -> None:
    assert strip_prefix("0.00.291.950 I llama_kv_cache: size = 1") == ("llama_kv_cache: size = 1", "INFO", None)
    assert strip_prefix("0.00.002.437 W srv          init: x")[1] == "WARNING"


def test_live_query_parsers(shared_data: Path) -> None:
    m = parse_llamacpp_metrics((shared_data / "llamacpp-cpu" / "metrics-Q8_0-kvq8_0.txt").read_text())
    assert m["tokens_predicted_total"] == 96  # 3 requests x 32 tokens (README of that directory)
    # shapes as returned by the xllamacpp server here (see test_llamacpp_lifecycle for the live call)
    assert parse_slots([{"id": 0, "n_ctx": 512, "is_processing": False}, {"id": 1, "n_ctx": 512,
                                                                          "is_processing": True}]) == \
        {"slots": 2, "slot_n_ctx": 512, "slots_processing": 1}
    assert parse_props({"default_generation_settings": {"n_ctx": 512}, "total_slots": 2, "build_info": "b1"}) == \
        {"n_ctx_slot": 512, "total_slots": 2, "engine_version": "b1"}


def test_detect_llamacpp(shared_data: Path) -> None:
    assert detect_engine((shared_data / "llamacpp-cpu" / "xllamacpp-F16-kvf16.log").read_text()) == "llamacpp"
