"""Hugging Face ``config.json`` (+ safetensors headers) -> ModelShape (shapes for capacity arithmetic).

Modelled: dense GQA/MHA; mixture-of-experts and MLA (``kv_lora_rank``) when the checkpoint's headers give the
parameter bytes; per-layer sliding/full hybrids (``layer_types``, ``sliding_window_pattern``). Refused, naming
the field: hybrid attention/Mamba stacks (``layers_block_type``, SSM keys), linear or chunked attention layers.
A sliding window switched on for every layer is *flagged* (``unsupported``): the full-attention KV figure is
then an upper bound on bytes per token. ``quantization_config`` gives the checkpoint's weight format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.hardware.catalog import CheckpointWeights, ModelShape

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads")
_SSM_KEYS = ("ssm_cfg", "mamba_d_state", "ssm_state_size", "mamba_expand", "linear_attn_config")


def load_hf_config(path: str | Path) -> ModelShape:
    """Read a config.json file; every problem is one BadInput line naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read --config {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise BadInput(f"--config {p}: not a text file (not UTF-8): expected a config.json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"--config {p}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise BadInput(f"--config {p}: expected a JSON object, got {type(data).__name__}")
    return shape_from_config(data, name=p.parent.name if p.name == "config.json" else p.stem, origin=str(p))


def _int(cfg: dict[str, Any], key: str, origin: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadInput(f"{origin}: {key} must be a positive integer, got {value!r}")
    return value


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and "hidden_size" not in cfg:
        text = cfg["text_config"]
        merged = {**text, "tie_word_embeddings": cfg.get("tie_word_embeddings", text.get("tie_word_embeddings"))}
        for key in ("quantization_config", "torch_dtype", "_name_or_path"):
            if key in cfg and key not in merged:
                merged[key] = cfg[key]
        return merged
    return cfg


def _experts(cfg: dict[str, Any]) -> tuple[str, int] | None:
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return key, value
    return None


def _sliding_layers(cfg: dict[str, Any], layers: int, origin: str) -> tuple[int | None, int]:
    """(window, number of sliding layers) for per-layer hybrids; (None, 0) when every layer is full attention.

    ``layer_types`` (gpt-oss, Gemma-3 in newer transformers, Qwen2/3 with max_window_layers) is read as is;
    Gemma-2/3 configs without it give ``sliding_window_pattern`` N: every N-th layer is full attention.
    Anything else per layer (linear, chunked or Mamba layers) is refused naming the field.
    """
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = {str(t) for t in layer_types}
        unknown = sorted(kinds - {"full_attention", "sliding_attention"})
        if unknown:
            raise BadInput(f"{origin}: not modelled: per-layer attention layer_types {', '.join(sorted(kinds))}")
        if len(layer_types) != layers:
            raise BadInput(f"{origin}: layer_types has {len(layer_types)} entries for {layers} layers")
        sliding = sum(1 for t in layer_types if t == "sliding_attention")
        if not sliding:
            return None, 0
        window = cfg.get("sliding_window")
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise BadInput(f"{origin}: layer_types has sliding_attention layers but sliding_window is {window!r}")
        return window, sliding
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 1 and cfg.get("sliding_window"):
        full = layers // pattern  # layers i with (i + 1) % pattern == 0 (transformers gemma3 is_sliding)
        return int(cfg["sliding_window"]), layers - full
    return None, 0


def shape_from_config(cfg: dict[str, Any], name: str = "config", origin: str = "config.json",
                      checkpoint: CheckpointWeights | None = None) -> ModelShape:
    """Build a ModelShape from a config dict (``text_config`` is used when the top level is multimodal).

    With ``checkpoint`` (the safetensors headers, see :func:`checkpoint_weights`) the parameter count and
    bytes are exact; without it, only dense layouts get a parameter count (estimated from shapes) and a
    mixture-of-experts or MLA config is refused: its count cannot be told from the config alone.
    """
    cfg = _text_config(cfg)
    if "layers_block_type" in cfg or any(k in cfg for k in _SSM_KEYS):
        raise BadInput(f"{origin}: not modelled: hybrid attention/Mamba layers (layers_block_type / SSM keys)")
    for key in ("attention_chunk_size", "no_rope_layers"):
        if cfg.get(key):
            raise BadInput(f"{origin}: not modelled: chunked local attention ({key}={_short(cfg[key])})")
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise BadInput(f"{origin}: incomplete config, missing {', '.join(missing)}")
    hidden = _int(cfg, "hidden_size", origin)
    layers = _int(cfg, "num_hidden_layers", origin)
    heads = _int(cfg, "num_attention_heads", origin)
    experts = _experts(cfg)
    if checkpoint is None and (experts or cfg.get("kv_lora_rank")):
        what = (f"mixture-of-experts ({experts[0]}={experts[1]})" if experts
                else f"multi-head latent attention (kv_lora_rank={cfg['kv_lora_rank']})")
        raise BadInput(f"{origin}: not modelled from config.json alone: {what}; its parameter bytes come from the "
                       "checkpoint's safetensors headers: use --model ORG/NAME")
    attention, v_head_dim = "gqa", None
    if cfg.get("kv_lora_rank"):
        # MLA: engines cache one latent of kv_lora_rank + qk_rope_head_dim per layer and token, shared by all heads
        # (vLLM MLAAttentionSpec: num_kv_heads 1, head_size_v 0; SGLang calculate_mla_kv_cache_dim).
        rope = cfg.get("qk_rope_head_dim")
        if isinstance(rope, bool) or not isinstance(rope, int) or rope < 0:
            raise BadInput(f"{origin}: kv_lora_rank is set but qk_rope_head_dim is {rope!r}")
        attention, kv_heads, head_dim, v_head_dim = "mla", 1, _int(cfg, "kv_lora_rank", origin) + rope, 0
    else:
        kv_heads = _int(cfg, "num_key_value_heads", origin) if cfg.get("num_key_value_heads") is not None else heads
        if cfg.get("head_dim") is not None:
            head_dim = _int(cfg, "head_dim", origin)
        else:
            if hidden % heads:
                raise BadInput(f"{origin}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
            head_dim = hidden // heads
    window, sliding = _sliding_layers(cfg, layers, origin)
    vocab = _int(cfg, "vocab_size", origin) if cfg.get("vocab_size") is not None else None
    inter = _int(cfg, "intermediate_size", origin) if cfg.get("intermediate_size") is not None else None
    tied = bool(cfg.get("tie_word_embeddings", False))
    unsupported: list[str] = []
    uniform_window = cfg.get("sliding_window")
    # Qwen2/Qwen3 configs carry sliding_window with use_sliding_window false; Mistral v0.1 has no switch.
    uses_window = cfg.get("use_sliding_window", cfg.get("model_type") not in ("qwen2", "qwen3", "qwen2_moe",
                                                                              "qwen3_moe"))
    if uniform_window and uses_window and not sliding and attention == "gqa":
        unsupported.append(f"sliding_window={uniform_window}")
    count = cfg.get("num_parameters") or cfg.get("params")
    if checkpoint is not None:
        params, estimated = float(checkpoint.logical_params), False
    elif isinstance(count, (int, float)) and not isinstance(count, bool) and count > 0:
        params, estimated = float(count), False
    else:
        kv_for_estimate = kv_heads
        params = float(estimate_params(cfg, hidden, layers, heads, kv_for_estimate, head_dim, vocab, inter, tied))
        estimated = True
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    per_tok = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token")
    moe_inter = cfg.get("moe_intermediate_size") or (inter if experts else None)
    source = origin + (" (params estimated from shapes)" if estimated else "")
    if checkpoint is not None:
        source += f"; {checkpoint.source}"
    return ModelShape(
        name=str(cfg.get("_name_or_path") or name), params=params, layers=layers, kv_heads=kv_heads,
        head_dim=head_dim, hidden_size=hidden, vocab_size=vocab, attention_heads=heads, intermediate_size=inter,
        tied_embeddings=tied, dtype={"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype),
        max_context=cfg.get("max_position_embeddings"), source=source,
        unsupported=tuple(unsupported), params_estimated=estimated, v_head_dim=v_head_dim, attention=attention,
        sliding_window=window, sliding_layers=sliding, num_experts=experts[1] if experts else None,
        experts_per_token=int(per_tok) if isinstance(per_tok, int) else None,
        moe_intermediate_size=int(moe_inter) if isinstance(moe_inter, int) else None, checkpoint=checkpoint,
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- quantization_config and safetensors headers ---------------------------------------------------------

# bytes per element of the safetensors dtypes (safetensors format spec; F4 = float4_e2m1 packed two per byte)
SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 0.5, "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}
# tensors that are quantization metadata, not parameters (scales, zero points, group indices)
_META_SUFFIXES = ("_scale", "_scale_inv", "_scales", ".scales", "qzeros", "g_idx", "_zero_point", "weight_shape",
                  "_scale_2", "input_scale", "k_scale", "v_scale", "global_scale")
_EMBEDDING_NAMES = ("embed_tokens.weight", "lm_head.weight", "wte.weight", "word_embeddings.weight",
                    "shared_head.head.weight")
# MoE routers stay unquantized in vLLM/SGLang (ReplicatedLinear with quant_config=None)
_ROUTER_SUFFIXES = ("mlp.gate.weight", "router.weight", "block_sparse_moe.gate.weight", "moe.gate.weight")


def weight_format_of(cfg: dict[str, Any]) -> tuple[str | None, str | None]:
    """(arm weights format, quant_method) from ``quantization_config``; (None, None) for an unquantized config.

    The format is None with a method when the method is one the arms cannot name (bitsandbytes, 8-bit GPTQ ...).
    """
    cfg = _text_config(cfg)
    qc = cfg.get("quantization_config") or cfg.get("compression_config")
    if not isinstance(qc, dict):
        return None, None
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8" or method == "fbgemm_fp8":
        return "fp8", method
    if method == "mxfp4":
        return "mxfp4", method
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round"):
        bits = qc.get("bits", qc.get("w_bit"))
        return ("w4a16" if bits == 4 else None), method
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or qc.get("quantization", {}).get("quant_algo", "")).upper()
        return {"FP8": "fp8", "NVFP4": "nvfp4"}.get(algo), method
    if method == "compressed-tensors":
        fmt = str(qc.get("format") or "")
        if "nvfp4" in fmt:
            return "nvfp4", method
        if "mxfp4" in fmt:
            return "mxfp4", method
        groups = qc.get("config_groups") or {}
        for group in groups.values() if isinstance(groups, dict) else ():
            w = group.get("weights") or {}
            bits, kind, acts = w.get("num_bits"), w.get("type"), group.get("input_activations")
            if bits == 8 and kind == "float":
                return "fp8", method
            if bits == 8 and kind == "int":
                return ("int8" if acts else None), method
            if bits == 4 and kind == "int":
                return "w4a16", method
            if bits == 4 and kind == "float":
                return "nvfp4", method
        return None, method
    return None, method or "unknown"


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def checkpoint_weights(tensors: dict[str, tuple[str, list[int]]], cfg: dict[str, Any],
                       source: str = "safetensors headers") -> CheckpointWeights:
    """Sum a checkpoint's tensors (name -> (safetensors dtype, shape)) into what an engine loads.

    Tensors of layers past ``num_hidden_layers`` in a config with ``num_nextn_predict_layers`` (DeepSeek's
    multi-token-prediction module) are counted apart: vLLM and SGLang skip them when serving without
    speculative decoding (vllm ``deepseek_v2.py`` ``get_spec_layer_idx_from_weight_name``).
    """
    text = _text_config(cfg)
    fmt, method = weight_format_of(cfg)
    n_layers = text.get("num_hidden_layers")
    layers = n_layers if isinstance(n_layers, int) else 0
    mtp = bool(text.get("num_nextn_predict_layers")) and layers > 0
    by_dtype: dict[str, int] = {}
    total = logical = emb = quant_params = quant_bytes = skipped = 0
    count = 0
    for name, (dtype, shape) in tensors.items():
        size = SAFETENSORS_DTYPE_BYTES.get(dtype)
        if size is None:
            raise BadInput(f"{source}: tensor {name} has dtype {dtype!r}, which quantrack has no size for")
        numel = _numel(shape)
        nbytes = int(numel * size)
        index = _layer_index(name)
        if mtp and index is not None and index >= layers:
            skipped += nbytes
            continue
        count += 1
        total += nbytes
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
        is_meta = name.endswith(_META_SUFFIXES)
        if not is_meta:
            if dtype == "I32" and name.endswith(("qweight", "weight_packed")):
                logical += numel * 8  # eight 4-bit values per int32 (AWQ/GPTQ/compressed-tensors pack-quantized)
            elif dtype == "U8" and (name.endswith("_blocks") or fmt in ("nvfp4", "mxfp4")):
                logical += numel * 2  # two FP4 values per byte (gpt-oss *_blocks, NVFP4 packed weights)
            else:
                logical += numel
        if name.endswith(_EMBEDDING_NAMES):
            emb += nbytes
        elif (not is_meta and dtype in ("BF16", "F16", "F32") and len(shape) >= 2 and "norm" not in name
              and not name.endswith(_ROUTER_SUFFIXES)):
            quant_params += numel
            quant_bytes += nbytes
    note = (f"layers >= {layers} (num_nextn_predict_layers={text.get('num_nextn_predict_layers')}, "
            f"{skipped / 1024**3:.2f} GiB) not loaded for serving") if skipped else ""
    return CheckpointWeights(
        bytes_by_dtype=dict(sorted(by_dtype.items())), total_bytes=total, logical_params=logical, tensors=count,
        embedding_bytes=emb, quantizable_params=quant_params, quantizable_bytes=quant_bytes,
        other_bytes=total - quant_bytes, skipped_bytes=skipped, skipped=note, weight_format=fmt,
        quant_method=method, source=source,
    )


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def estimate_params(cfg: dict[str, Any], hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                    vocab: int | None, inter: int | None, tied: bool) -> int:
    """Dense decoder parameter count from shapes (Llama/Qwen/Mistral layout: SwiGLU MLP, RMSNorm).

    Counts q/k/v/o, gate/up/down, two norms per layer, the final norm, the embedding and (untied) LM head;
    q/k/v bias when ``attention_bias`` or model_type qwen2; q/k norms for model_type qwen3.
    Reproduces the published counts of Llama-3-8B, Qwen2.5-7B, Qwen3-8B, SmolLM2-135M (tests/unit/test_hfconfig.py).
    """
    q, kv = heads * head_dim, kv_heads * head_dim
    mtype = str(cfg.get("model_type", ""))
    attn = hidden * q + 2 * hidden * kv + q * hidden
    if cfg.get("attention_bias") or mtype == "qwen2":
        attn += q + 2 * kv
    if mtype == "qwen3":
        attn += 2 * head_dim
    mlp = 3 * hidden * (inter or 4 * hidden)
    per_layer = attn + mlp + 2 * hidden
    emb = (vocab or 0) * hidden
    return emb * (1 if tied else 2) + layers * per_layer + hidden
