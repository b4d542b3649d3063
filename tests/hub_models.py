"""Tensor lists (name -> (safetensors dtype, shape)) with the names and dtypes of the published checkpoints.

Built from each model's real config (tests/data/hub/*.config.json) following the checkpoint layouts those
repositories publish; the shapes follow from the config. They are what :func:`hub_fixture.shape_only_header`
turns into safetensors headers, so the tests check quantrack's arithmetic on headers against the numbers the
model authors publish (parameter counts, checkpoint sizes), not against these builders.

Layouts (tensor names as in each repo's ``model.safetensors.index.json``):
* Llama FP8 (neuralmagic / RedHatAI): every Linear ``weight`` F8_E4M3 with scalar F32 ``weight_scale`` and
  ``input_scale``; embeddings, norms, ``lm_head`` BF16 (names: llm-d/llm-d-kv-cache-manager@eea3a359
  tests/e2e/redis_mock/testdata/local-llama3/model.safetensors.index.json).
* Qwen3 MoE: BF16; ``mlp.gate`` router + ``mlp.experts.{e}.{gate,up,down}_proj``; q/k RMSNorm per head.
* DeepSeek-V3: FP8 E4M3 Linear weights with F32 ``weight_scale_inv`` per 128x128 block (quantization_config
  weight_block_size); MLA ``q_a/q_b/kv_a_proj_with_mqa/kv_b/o`` projections; layers < first_k_dense_replace
  dense; ``mlp.gate`` + ``e_score_correction_bias``, 256 routed + 1 shared expert; MTP layer 61 with
  ``enorm/hnorm/eh_proj/shared_head`` (tenstorrent/tt-metal models/demos/deepseek_v3/reference/README_WEIGHTS.md).
* Mixtral: BF16; ``block_sparse_moe.gate`` router + ``block_sparse_moe.experts.{e}.w1/w2/w3``.
* AWQ (GEMM, 4-bit, zero point): every Linear as I32 ``qweight`` [in, out/8] (eight 4-bit values per int32),
  I32 ``qzeros`` [in/group, out/8] and F16 ``scales`` [in/group, out]; embeddings, norms, biases, ``lm_head``
  F16 (AutoAWQ's GEMM layout, the one vLLM's ``awq``/``awq_marlin`` loaders read).
* gpt-oss: BF16 attention (with biases and ``sinks``) and router; experts as U8 ``*_blocks`` (two FP4 E2M1
  per byte, blocks of 32) with U8 E8M0 ``*_scales`` and BF16 biases (quantization_config mxfp4).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HUB_DATA = Path(__file__).resolve().parent / "data" / "hub"
Tensors = dict[str, tuple[str, list[int]]]


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HUB_DATA / f"{name}.config.json").read_text())
    return data


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def llama_fp8(cfg: dict[str, Any]) -> Tensors:
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    t: Tensors = {"model.embed_tokens.weight": ("BF16", [vocab, h])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("BF16", [h])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [h])
        for proj, shape in (("self_attn.q_proj", [q, h]), ("self_attn.k_proj", [kv, h]), ("self_attn.v_proj", [kv, h]),
                            ("self_attn.o_proj", [h, q]), ("mlp.gate_proj", [inter, h]), ("mlp.up_proj", [inter, h]),
                            ("mlp.down_proj", [h, inter])):
            t[p + proj + ".weight"] = ("F8_E4M3", shape)
            t[p + proj + ".weight_scale"] = ("F32", [])
            t[p + proj + ".input_scale"] = ("F32", [])
    t["model.norm.weight"] = ("BF16", [h])
    t["lm_head.weight"] = ("BF16", [vocab, h])
    return t


def qwen3_moe(cfg: dict[str, Any]) -> Tensors:
    h, vocab, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    e, mi = cfg["num_experts"], cfg["moe_intermediate_size"]
    t: Tensors = {"model.embed_tokens.weight": ("BF16", [vocab, h])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("BF16", [h])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [h])
        t[p + "self_attn.q_proj.weight"] = ("BF16", [q, h])
        t[p + "self_attn.k_proj.weight"] = ("BF16", [kv, h])
        t[p + "self_attn.v_proj.weight"] = ("BF16", [kv, h])
        t[p + "self_attn.o_proj.weight"] = ("BF16", [h, q])
        t[p + "self_attn.q_norm.weight"] = ("BF16", [hd])
        t[p + "self_attn.k_norm.weight"] = ("BF16", [hd])
        t[p + "mlp.gate.weight"] = ("BF16", [e, h])
        for x in range(e):
            t[p + f"mlp.experts.{x}.gate_proj.weight"] = ("BF16", [mi, h])
            t[p + f"mlp.experts.{x}.up_proj.weight"] = ("BF16", [mi, h])
            t[p + f"mlp.experts.{x}.down_proj.weight"] = ("BF16", [h, mi])
    t["model.norm.weight"] = ("BF16", [h])
    t["lm_head.weight"] = ("BF16", [vocab, h])
    return t


def _fp8_block(t: Tensors, name: str, out_f: int, in_f: int) -> None:
    t[name + ".weight"] = ("F8_E4M3", [out_f, in_f])
    t[name + ".weight_scale_inv"] = ("F32", [_cdiv(out_f, 128), _cdiv(in_f, 128)])


def deepseek_v3(cfg: dict[str, Any]) -> Tensors:
    h, vocab, heads = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    inter, mi, e = cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["n_routed_experts"]
    t: Tensors = {"model.embed_tokens.weight": ("BF16", [vocab, h])}
    for i in range(cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("BF16", [h])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [h])
        _fp8_block(t, p + "self_attn.q_a_proj", qr, h)
        t[p + "self_attn.q_a_layernorm.weight"] = ("BF16", [qr])
        _fp8_block(t, p + "self_attn.q_b_proj", heads * (nope + rope), qr)
        _fp8_block(t, p + "self_attn.kv_a_proj_with_mqa", kvr + rope, h)
        t[p + "self_attn.kv_a_layernorm.weight"] = ("BF16", [kvr])
        _fp8_block(t, p + "self_attn.kv_b_proj", heads * (nope + vd), kvr)
        _fp8_block(t, p + "self_attn.o_proj", h, heads * vd)
        if i < cfg["first_k_dense_replace"]:
            _fp8_block(t, p + "mlp.gate_proj", inter, h)
            _fp8_block(t, p + "mlp.up_proj", inter, h)
            _fp8_block(t, p + "mlp.down_proj", h, inter)
        else:
            t[p + "mlp.gate.weight"] = ("BF16", [e, h])
            t[p + "mlp.gate.e_score_correction_bias"] = ("F32", [e])
            for x in [*(f"experts.{j}" for j in range(e)), "shared_experts"]:
                _fp8_block(t, p + f"mlp.{x}.gate_proj", mi, h)
                _fp8_block(t, p + f"mlp.{x}.up_proj", mi, h)
                _fp8_block(t, p + f"mlp.{x}.down_proj", h, mi)
        if i >= cfg["num_hidden_layers"]:  # the MTP module
            t[p + "enorm.weight"] = ("BF16", [h])
            t[p + "hnorm.weight"] = ("BF16", [h])
            t[p + "eh_proj.weight"] = ("BF16", [h, 2 * h])
            t[p + "embed_tokens.weight"] = ("BF16", [vocab, h])
            t[p + "shared_head.norm.weight"] = ("BF16", [h])
            t[p + "shared_head.head.weight"] = ("BF16", [vocab, h])
    t["model.norm.weight"] = ("BF16", [h])
    t["lm_head.weight"] = ("BF16", [vocab, h])
    return t


def gpt_oss(cfg: dict[str, Any]) -> Tensors:
    h, vocab, hd, e = cfg["hidden_size"], cfg["vocab_size"], cfg["head_dim"], cfg["num_local_experts"]
    q, kv, inter = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    t: Tensors = {"model.embed_tokens.weight": ("BF16", [vocab, h])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("BF16", [h])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [h])
        for proj, out_f, in_f in (("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("o_proj", h, q)):
            t[p + f"self_attn.{proj}.weight"] = ("BF16", [out_f, in_f])
            t[p + f"self_attn.{proj}.bias"] = ("BF16", [out_f])
        t[p + "self_attn.sinks"] = ("BF16", [cfg["num_attention_heads"]])
        t[p + "mlp.router.weight"] = ("BF16", [e, h])
        t[p + "mlp.router.bias"] = ("BF16", [e])
        t[p + "mlp.experts.gate_up_proj_blocks"] = ("U8", [e, 2 * inter, h // 32, 16])
        t[p + "mlp.experts.gate_up_proj_scales"] = ("U8", [e, 2 * inter, h // 32])
        t[p + "mlp.experts.gate_up_proj_bias"] = ("BF16", [e, 2 * inter])
        t[p + "mlp.experts.down_proj_blocks"] = ("U8", [e, h, inter // 32, 16])
        t[p + "mlp.experts.down_proj_scales"] = ("U8", [e, h, inter // 32])
        t[p + "mlp.experts.down_proj_bias"] = ("BF16", [e, h])
    t["model.norm.weight"] = ("BF16", [h])
    t["lm_head.weight"] = ("BF16", [vocab, h])
    return t


def qwen2_awq(cfg: dict[str, Any]) -> Tensors:
    """Qwen2 dense with AWQ GEMM Linear layers (q/k/v keep their F16 bias)."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    group = cfg["quantization_config"]["group_size"]
    t: Tensors = {"model.embed_tokens.weight": ("F16", [vocab, h])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("F16", [h])
        t[p + "post_attention_layernorm.weight"] = ("F16", [h])
        for proj, out_f, in_f in (("self_attn.q_proj", q, h), ("self_attn.k_proj", kv, h), ("self_attn.v_proj", kv, h),
                                  ("self_attn.o_proj", h, q), ("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h),
                                  ("mlp.down_proj", h, inter)):
            t[p + proj + ".qweight"] = ("I32", [in_f, out_f // 8])
            t[p + proj + ".qzeros"] = ("I32", [in_f // group, out_f // 8])
            t[p + proj + ".scales"] = ("F16", [in_f // group, out_f])
            if proj.startswith("self_attn.") and proj != "self_attn.o_proj":
                t[p + proj + ".bias"] = ("F16", [out_f])
    t["model.norm.weight"] = ("F16", [h])
    t["lm_head.weight"] = ("F16", [vocab, h])
    return t


def mixtral(cfg: dict[str, Any]) -> Tensors:
    h, inter, vocab, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_local_experts"]
    hd = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    t: Tensors = {"model.embed_tokens.weight": ("BF16", [vocab, h])}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ("BF16", [h])
        t[p + "post_attention_layernorm.weight"] = ("BF16", [h])
        t[p + "self_attn.q_proj.weight"] = ("BF16", [q, h])
        t[p + "self_attn.k_proj.weight"] = ("BF16", [kv, h])
        t[p + "self_attn.v_proj.weight"] = ("BF16", [kv, h])
        t[p + "self_attn.o_proj.weight"] = ("BF16", [h, q])
        t[p + "block_sparse_moe.gate.weight"] = ("BF16", [e, h])
        for x in range(e):
            t[p + f"block_sparse_moe.experts.{x}.w1.weight"] = ("BF16", [inter, h])
            t[p + f"block_sparse_moe.experts.{x}.w2.weight"] = ("BF16", [h, inter])
            t[p + f"block_sparse_moe.experts.{x}.w3.weight"] = ("BF16", [inter, h])
    t["model.norm.weight"] = ("BF16", [h])
    t["lm_head.weight"] = ("BF16", [vocab, h])
    return t
