"""quantrack.models.hfexport: a tiny Llama GGUF made here (gguf 0.19.0: Q4_1 / Q8_0 / F32 tensors, a byte-level BPE
vocabulary), exported to a Hugging Face directory, and read back tensor by tensor against the GGUF's dequantized
values; the Q/K rows checked against llama.cpp's own permutation (conversion/llama.py:L176-L181)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from quantrack.errors import BadInput
from quantrack.models import hfexport

HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 64, 4, 2, 128, 2
HEAD_DIM = HIDDEN // HEADS
BYTES = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ċ"]
TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + BYTES + ["ab", "Ġa", "Ġab"]
MERGES = ["a b", "Ġ ab"]
VOCAB = len(TOKENS)


def llamacpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp@0c1e57098:conversion/llama.py:L176-L181, transcribed with numpy for the check."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bf16_exact(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values that bf16 represents exactly (so a round trip must be bit-exact)."""
    x = rng.standard_normal(shape).astype(np.float32) * 0.05
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def make_gguf(path: Path, *, tied: bool = True, arch: str = "llama", extra_tensor: str | None = None) -> dict:
    """Write the tiny model; returns {"hf": HF-layout Q/K weights written permuted as F32, "gguf": name->type}."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types([3, 3, 3] + [1] * (VOCAB - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{{ messages }}")
    hf_qk: dict[str, np.ndarray] = {}

    def quant(name: str, values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
        data = values if qtype == gguf.GGMLQuantizationType.F32 else gguf.quants.quantize(values, qtype)
        w.add_tensor(name, data, raw_dtype=qtype)

    q41, q80, f32 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    quant("token_embd.weight", rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), q80)
    for b in range(LAYERS):
        quant(f"blk.{b}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), f32)
        if b == 0:  # layer 0: Q/K as F32 from known HF-layout weights, permuted the way llama.cpp's converter does
            q_hf, k_hf = bf16_exact(rng, (HIDDEN, HIDDEN)), bf16_exact(rng, (KV_HEADS * HEAD_DIM, HIDDEN))
            hf_qk["q"], hf_qk["k"] = q_hf, k_hf
            quant("blk.0.attn_q.weight", llamacpp_permute(q_hf, HEADS, HEADS), f32)
            quant("blk.0.attn_k.weight", llamacpp_permute(k_hf, HEADS, KV_HEADS), f32)
        else:
            quant(f"blk.{b}.attn_q.weight", rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), q41)
            quant(f"blk.{b}.attn_k.weight", rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32),
                  q41)
        quant(f"blk.{b}.attn_v.weight", rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32), q41)
        quant(f"blk.{b}.attn_output.weight", rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), q41)
        quant(f"blk.{b}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32), f32)
        quant(f"blk.{b}.ffn_gate.weight", rng.standard_normal((FF, HIDDEN)).astype(np.float32), q41)
        quant(f"blk.{b}.ffn_up.weight", rng.standard_normal((FF, HIDDEN)).astype(np.float32), q41)
        quant(f"blk.{b}.ffn_down.weight", rng.standard_normal((HIDDEN, FF)).astype(np.float32), q41)
    quant("output_norm.weight", np.ones(HIDDEN, dtype=np.float32), f32)
    if not tied:
        quant("output.weight", rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), q80)
    if extra_tensor:
        quant(extra_tensor, np.ones(HEAD_DIM // 2, dtype=np.float32), f32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf_qk


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("hfexport")
    src = tmp / "tiny.gguf"
    hf_qk = make_gguf(src)
    hfexport.export_hf(src, tmp / "hf")
    return src, tmp / "hf", hf_qk


def test_every_tensor_reads_back_as_the_ggufs_dequantized_values(exported: tuple[Path, Path, dict]) -> None:
    src, out, _ = exported
    got = hfexport.read_bf16(out / "model.safetensors")
    reader = gguf.GGUFReader(str(src))
    assert len(got) == len(reader.tensors) == 2 + 9 * LAYERS  # embedding, output norm, 9 per block
    types = {t.tensor_type.name for t in reader.tensors}
    assert {"Q4_1", "Q8_0", "F32"} <= types
    for t in reader.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name.endswith("attn_q.weight"):
            want = hfexport.unpermute(want, HEADS)
        elif t.name.endswith("attn_k.weight"):
            want = hfexport.unpermute(want, KV_HEADS)
        name = hfexport.hf_name(t.name)
        assert got[name].shape == want.shape, name
        # bf16 of the dequantized value, bit for bit; and within bf16's half-ulp (2^-9 relative) of it
        np.testing.assert_array_equal(got[name], hfexport.bf16_to_f32(hfexport.bf16_bits(want)), err_msg=name)
        np.testing.assert_allclose(got[name], want, rtol=2.0**-8, atol=0, err_msg=name)
    assert "lm_head.weight" not in got  # tied: no output.weight in the GGUF


def test_q_and_k_come_back_in_hugging_face_row_order(exported: tuple[Path, Path, dict]) -> None:
    """HF weights -> llama.cpp's permutation -> GGUF -> export gives the HF weights back, exactly."""
    _, out, hf_qk = exported
    got = hfexport.read_bf16(out / "model.safetensors")
    np.testing.assert_array_equal(got["model.layers.0.self_attn.q_proj.weight"], hf_qk["q"])
    np.testing.assert_array_equal(got["model.layers.0.self_attn.k_proj.weight"], hf_qk["k"])
    # and the permutation really moves rows here (the check above is not trivially true)
    assert not np.array_equal(llamacpp_permute(hf_qk["q"], HEADS, HEADS), hf_qk["q"])


def test_unpermute_inverts_llamacpp_permute_for_gqa() -> None:
    x = np.arange(6 * 2 * 4 * 3, dtype=np.float32).reshape(6 * 2 * 4, 3)
    for n_head, n_kv in ((12, 12), (12, 6), (12, 2)):
        np.testing.assert_array_equal(hfexport.unpermute(llamacpp_permute(x, n_head, n_kv), n_kv), x)
    with pytest.raises(BadInput, match="rotary pairs"):
        hfexport.unpermute(np.zeros((10, 2), dtype=np.float32), 4)


def test_bf16_rounding_is_nearest_even() -> None:
    one_half_ulp, three_half_ulp = 1 + 2.0**-8, 1 + 3 * 2.0**-8  # exactly between two bf16 values
    vals = np.array([one_half_ulp, three_half_ulp, 1 + 2.0**-8 + 2.0**-20, -2.5, 0.0], dtype=np.float32)
    back = hfexport.bf16_to_f32(hfexport.bf16_bits(vals))
    np.testing.assert_array_equal(back, np.array([1.0, 1 + 2.0**-6, 1 + 2.0**-7, -2.5, 0.0], dtype=np.float32))
    with pytest.raises(BadInput, match="NaN"):
        hfexport.bf16_bits(np.array([np.nan], dtype=np.float32))


def test_config_and_tokenizer_files(exported: tuple[Path, Path, dict]) -> None:
    _, out, _ = exported
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["head_dim"]) == (
        HIDDEN, LAYERS, HEADS, KV_HEADS, FF, HEAD_DIM)
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 100000.0
    assert cfg["vocab_size"] == VOCAB and cfg["tie_word_embeddings"] is True
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|im_end|>" and tok_cfg["model_max_length"] == 256
    assert tok_cfg["chat_template"] == "{{ messages }}"
    marker = json.loads((out / hfexport.MARKER).read_text())
    assert marker["parameters"] == sum(v.size for v in hfexport.read_bf16(out / "model.safetensors").values())
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("ab ab", add_special_tokens=False).tokens == ["ab", "Ġab"]
    assert tok.encode("<|im_start|>ab", add_special_tokens=False).ids == [1, TOKENS.index("ab")]


def test_untied_lm_head_is_exported(tmp_path: Path) -> None:
    make_gguf(tmp_path / "u.gguf", tied=False)
    hfexport.export_hf(tmp_path / "u.gguf", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"] is False
    assert "lm_head.weight" in hfexport.read_bf16(tmp_path / "hf" / "model.safetensors")


def test_refuses_what_it_cannot_export_and_writes_nothing(tmp_path: Path) -> None:
    make_gguf(tmp_path / "r.gguf", extra_tensor="rope_freqs.weight")
    with pytest.raises(BadInput, match="rope_freqs.weight"):
        hfexport.export_hf(tmp_path / "r.gguf", tmp_path / "hf")
    make_gguf(tmp_path / "q.gguf", arch="phi3")
    with pytest.raises(BadInput, match=r"^GGUF architecture 'phi3': only 'llama', 'qwen2' GGUFs are exported"):
        hfexport.export_hf(tmp_path / "q.gguf", tmp_path / "hf2")
    assert not list(tmp_path.glob("hf*"))


def test_model_reference_hf_bf16_is_known_and_cached_by_its_marker(tmp_path: Path) -> None:
    """smollm2:hf-bf16 parses, and cached_path answers from the export's marker file (never exports itself)."""
    import os

    from quantrack.models import gguf as gguf_models
    from quantrack.models import ref as models_ref

    assert models_ref.parse_ref("smollm2:hf-bf16") == ("smollm2", models_ref.HF_BF16)
    src = tmp_path / gguf_models.SMOLLM2_FILE
    make_gguf(src)
    dst = tmp_path / "SmolLM2-135M-Instruct.hf-bf16"
    assert models_ref.cached_path("smollm2:hf-bf16", cache_dir=tmp_path) is None  # not exported yet
    hfexport.export_hf(src, dst)
    assert models_ref.cached_path("smollm2:hf-bf16", cache_dir=tmp_path) == dst
    later = (dst / hfexport.MARKER).stat().st_mtime + 10
    os.utime(src, (later, later))  # a newer checkpoint makes the export stale
    assert models_ref.cached_path("smollm2:hf-bf16", cache_dir=tmp_path) is None
    with pytest.raises(BadInput, match="HF-BF16"):
        models_ref.cached_path("smollm2:hf-fp4", cache_dir=tmp_path)


# --- Qwen2: attention biases, no Q/K permutation, untied head, its tokenizer and chat template --------------------

QWEN_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + BYTES + [str(d) for d in range(10)] + ["ab", "Ġa",
                                                                                                       "Ġab", "12"]
QWEN_MERGES = ["a b", "Ġ ab", "1 2"]
QWEN_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def make_qwen2(path: Path) -> dict[str, np.ndarray]:
    """A tiny qwen2 GGUF (F32 / Q8_0 / Q4_1 tensors, Q/K/V biases, an untied output); returns the F32 values of
    the tensors written unquantized, by GGUF name."""
    rng = np.random.default_rng(11)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(QWEN_TOKENS)
    w.add_token_types([3, 3, 3] + [1] * (len(QWEN_TOKENS) - 3))
    w.add_token_merges(QWEN_MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(QWEN_TEMPLATE)
    exact: dict[str, np.ndarray] = {}
    vocab = len(QWEN_TOKENS)

    def put(name: str, values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
        if qtype == gguf.GGMLQuantizationType.F32:
            exact[name] = values
            w.add_tensor(name, values, raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    f32, q80, q41 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
    put("token_embd.weight", rng.standard_normal((vocab, HIDDEN)).astype(np.float32), q80)
    for b in range(LAYERS):
        put(f"blk.{b}.attn_norm.weight", bf16_exact(rng, (HIDDEN,)), f32)
        put(f"blk.{b}.attn_q.weight", bf16_exact(rng, (HIDDEN, HIDDEN)), f32)  # F32: a permutation would show
        put(f"blk.{b}.attn_k.weight", bf16_exact(rng, (KV_HEADS * HEAD_DIM, HIDDEN)), f32)
        put(f"blk.{b}.attn_v.weight", rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32), q41)
        put(f"blk.{b}.attn_q.bias", bf16_exact(rng, (HIDDEN,)), f32)
        put(f"blk.{b}.attn_k.bias", bf16_exact(rng, (KV_HEADS * HEAD_DIM,)), f32)
        put(f"blk.{b}.attn_v.bias", bf16_exact(rng, (KV_HEADS * HEAD_DIM,)), f32)
        put(f"blk.{b}.attn_output.weight", rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), q41)
        put(f"blk.{b}.ffn_norm.weight", bf16_exact(rng, (HIDDEN,)), f32)
        put(f"blk.{b}.ffn_gate.weight", rng.standard_normal((FF, HIDDEN)).astype(np.float32), q41)
        put(f"blk.{b}.ffn_up.weight", rng.standard_normal((FF, HIDDEN)).astype(np.float32), q41)
        put(f"blk.{b}.ffn_down.weight", rng.standard_normal((HIDDEN, FF)).astype(np.float32), q41)
    put("output_norm.weight", bf16_exact(rng, (HIDDEN,)), f32)
    put("output.weight", rng.standard_normal((vocab, HIDDEN)).astype(np.float32), q80)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return exact


def test_qwen2_is_exported_tensor_by_tensor_with_biases_and_no_qk_permutation(tmp_path: Path) -> None:
    src, out = tmp_path / "qwen.gguf", tmp_path / "hf"
    exact = make_qwen2(src)
    summary = hfexport.export_hf(src, out)
    got = hfexport.read_bf16(out / "model.safetensors")
    reader = gguf.GGUFReader(str(src))
    assert len(got) == len(reader.tensors) == 3 + 12 * LAYERS  # embedding, norm, head; 9 weights + 3 biases
    for t in reader.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        name = hfexport.hf_name(t.name, "qwen2")
        np.testing.assert_array_equal(got[name], hfexport.bf16_to_f32(hfexport.bf16_bits(want)), err_msg=t.name)
        if t.name in exact:  # written bf16-exact: the export holds exactly these values, in this row order
            np.testing.assert_array_equal(got[name].reshape(exact[t.name].shape), exact[t.name], err_msg=t.name)
    assert got["model.layers.1.self_attn.k_proj.bias"].shape == (KV_HEADS * HEAD_DIM,)
    assert "lm_head.weight" in got and summary["architecture"] == "qwen2"
    assert summary["qk_unpermuted"].startswith("no")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["model_type"] == "qwen2"
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (LAYERS, HEADS,
                                                                                                   KV_HEADS)
    assert cfg["tie_word_embeddings"] is False and cfg["use_sliding_window"] is False
    assert cfg["rope_theta"] == 1000000.0 and cfg["rms_norm_eps"] == 1e-6 and "attention_bias" not in cfg
    assert cfg["vocab_size"] == len(QWEN_TOKENS) and cfg["eos_token_id"] == 2
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "Qwen2Tokenizer" and tok_cfg["chat_template"] == QWEN_TEMPLATE
    assert tok_cfg["eos_token"] == "<|im_end|>"


def test_qwen2_tokenizer_splits_digits_one_by_one(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    make_qwen2(tmp_path / "qwen.gguf")
    hfexport.export_hf(tmp_path / "qwen.gguf", tmp_path / "hf")
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    # "12" is a token, but Qwen2's pre-tokenizer isolates each digit first, as llama.cpp's qwen2 regex does
    assert tok.encode("ab 12", add_special_tokens=False).tokens == ["ab", "Ġ", "1", "2"]
    assert tok.encode("<|im_start|>ab ab", add_special_tokens=False).tokens == ["<|im_start|>", "ab", "Ġab"]
    assert tok.decode(tok.encode("ab ab 1").ids) == "ab ab 1"
