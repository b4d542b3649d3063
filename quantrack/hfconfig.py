"""Hugging Face ``config.json`` -> ModelShape (shapes for capacity arithmetic).

Layouts capacity does not model are refused plainly rather than miscomputed: MLA (``kv_lora_rank``), hybrid
attention/Mamba stacks (``layers_block_type``, SSM keys) and per-layer attention types (``layer_types`` with
sliding layers). A sliding window that is switched on for every layer is *flagged* (``unsupported``): the
full-attention KV figure is then an upper bound on bytes per token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantrack.catalog import ModelShape
from quantrack.errors import BadInput

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


def shape_from_config(cfg: dict[str, Any], name: str = "config", origin: str = "config.json") -> ModelShape:
    """Build a ModelShape from a config dict (``text_config`` is used when the top level is multimodal)."""
    if "text_config" in cfg and isinstance(cfg["text_config"], dict) and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get("tie_word_embeddings",
                                                                   cfg["text_config"].get("tie_word_embeddings"))}
    if cfg.get("kv_lora_rank"):
        raise BadInput(f"{origin}: not modelled: multi-head latent attention (kv_lora_rank={cfg['kv_lora_rank']})")
    if "layers_block_type" in cfg or any(k in cfg for k in _SSM_KEYS):
        raise BadInput(f"{origin}: not modelled: hybrid attention/Mamba layers (layers_block_type / SSM keys)")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and any("sliding" in str(t) or "linear" in str(t) for t in layer_types):
        kinds = sorted({str(t) for t in layer_types})
        raise BadInput(f"{origin}: not modelled: mixed per-layer attention ({', '.join(kinds)})")
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise BadInput(f"{origin}: incomplete config, missing {', '.join(missing)}")
    hidden = _int(cfg, "hidden_size", origin)
    layers = _int(cfg, "num_hidden_layers", origin)
    heads = _int(cfg, "num_attention_heads", origin)
    kv_heads = _int(cfg, "num_key_value_heads", origin) if cfg.get("num_key_value_heads") is not None else heads
    if cfg.get("head_dim") is not None:
        head_dim = _int(cfg, "head_dim", origin)
    else:
        if hidden % heads:
            raise BadInput(f"{origin}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        head_dim = hidden // heads
    vocab = _int(cfg, "vocab_size", origin) if cfg.get("vocab_size") is not None else None
    inter = _int(cfg, "intermediate_size", origin) if cfg.get("intermediate_size") is not None else None
    tied = bool(cfg.get("tie_word_embeddings", False))
    unsupported: list[str] = []
    window = cfg.get("sliding_window")
    # Qwen2/Qwen3 configs carry sliding_window with use_sliding_window false; Mistral v0.1 has no switch.
    uses_window = cfg.get("use_sliding_window", cfg.get("model_type") not in ("qwen2", "qwen3", "qwen2_moe"))
    if window and uses_window:
        unsupported.append(f"sliding_window={window}")
    if cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts"):
        unsupported.append("mixture-of-experts (params must come from the checkpoint, not the shapes)")
    count = cfg.get("num_parameters") or cfg.get("params")
    if isinstance(count, (int, float)) and not isinstance(count, bool) and count > 0:
        params, estimated = float(count), False
    else:
        params = float(estimate_params(cfg, hidden, layers, heads, kv_heads, head_dim, vocab, inter, tied))
        estimated = True
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return ModelShape(
        name=str(cfg.get("_name_or_path") or name), params=params, layers=layers, kv_heads=kv_heads,
        head_dim=head_dim, hidden_size=hidden, vocab_size=vocab, attention_heads=heads, intermediate_size=inter,
        tied_embeddings=tied, dtype={"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype),
        max_context=cfg.get("max_position_embeddings"), source=f"{origin}" + (" (params estimated from shapes)"
                                                                              if estimated else ""),
        unsupported=tuple(unsupported), params_estimated=estimated,
    )


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
