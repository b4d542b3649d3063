"""Capacity arithmetic: weights, KV budget, KV tokens and concurrency per arm (pure, no I/O).

Two models live here, and every output says which one it came from:

* ``plan``: the seeds' **naive** arithmetic (lab06 §1, vllm-article Experiment 1): every parameter at the
  format's bytes, ``budget = memory * tp * util - weights - overhead``, ``tokens = floor(budget / kv_bytes)``.
  It ignores what an engine reserves, so it is an upper bound. It reproduces the seeds' tables exactly.
* ``predict_engine``: an **engine-aware** prediction of the number the engine will log (vLLM's
  "GPU KV cache size", SGLang's ``max_total_num_tokens``, llama.cpp's KV buffer size), following the engines'
  own budgeting code as summarised in engine-facts.md (project reference notes) §4, with the few constants that are not
  derivable from shapes calibrated on real H200 logs and documented in docs/capacity-model.md.

Layouts beyond dense GQA (docs/capacity-model.md §7): MLA (one latent per layer and token, on every TP rank),
per-layer sliding/full hybrids (vLLM's hybrid allocator groups, SGLang's SWA pool split), mixture-of-experts
(every expert resident; weight bytes from the checkpoint's safetensors headers when the shape carries them).

Everything here is derived, never measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from quantrack.arms import Arm
from quantrack.engines.base import CapacitySettings, EnginePrediction
from quantrack.engines.registry import DEFAULT_ENGINE, DEFAULT_UTIL, get_adapter
from quantrack.engines.registry import ENGINE_KINDS as ENGINES
from quantrack.errors import BadInput
from quantrack.hardware.catalog import GPU, ModelShape

GiB = 1024**3
MiB = 1024**2

# --- bytes per weight parameter ---------------------------------------------------------------------------
# 4-bit weight-only (AWQ/GPTQ, group size 128): 4 bits per weight, plus per group of 128 weights one fp16 scale
# (2 bytes) and one packed 4-bit zero point (0.5 byte): (2 + 0.5) / 128 = 0.01953 byte/weight (+3.9%).
W4A16_GROUP_SIZE = 128
W4A16_GROUP_OVERHEAD = (2 + 0.5) / W4A16_GROUP_SIZE
_DENSE_WEIGHT_BYTES: dict[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
    "w4a16": 0.5 + W4A16_GROUP_OVERHEAD,
    # NVFP4: 4-bit E2M1 values + one FP8 E4M3 scale per 16 values (1/16 byte); MXFP4: + one E8M0 per 32.
    "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32,
}
# GGUF / KV names that map onto gguf.constants.GGMLQuantizationType members.
_GGML_NAMES = {
    "f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q6_k": "Q6_K", "q5_0": "Q5_0",
    "q5_1": "Q5_1", "q5_k": "Q5_K", "q4_0": "Q4_0", "q4_1": "Q4_1", "q4_k": "Q4_K", "iq4_nl": "IQ4_NL",
}
# KV-cache element sizes for engine (GPU) dtypes. nvfp4: 4-bit value + FP8 scale per 16 = 0.5625 byte
# (approximate: vLLM/SGLang also keep a per-tensor scale; engine-facts §4.3 "extra terms for FP4 scales").
_KV_BYTES: dict[str, float] = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
    "nvfp4": 0.5 + 1 / 16,
}
_KV_GGML = {"f32", "f16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def ggml_block(type_name: str) -> tuple[int, int]:
    """(weights per block, bytes per block) for a GGML type, from gguf.constants.GGML_QUANT_SIZES."""
    from gguf.constants import (  # lazy: gguf is not needed otherwise
        GGML_QUANT_SIZES,
        GGMLQuantizationType,
    )

    key = _GGML_NAMES.get(type_name.lower(), type_name.upper())
    try:
        qtype = GGMLQuantizationType[key]
    except KeyError:
        raise BadInput(f"unknown GGML type {type_name!r}") from None
    block, size = GGML_QUANT_SIZES[qtype]
    return int(block), int(size)


def ggml_row_size(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` elements of a GGML type (ggml_row_size: n / block * block bytes)."""
    block, size = ggml_block(type_name)
    if n % block:
        raise BadInput(f"row of {n} elements is not a multiple of the {type_name} block size {block}")
    return n // block * size


def weight_bytes_per_param(fmt: str) -> float:
    """Bytes per parameter for a weight format (naive: every parameter stored in this format)."""
    f = fmt.lower()
    if f in _DENSE_WEIGHT_BYTES:
        return _DENSE_WEIGHT_BYTES[f]
    if f in _GGML_NAMES:
        block, size = ggml_block(f)
        return size / block
    raise BadInput(f"no byte size known for weights format {fmt!r}")


def kv_bytes_per_element(dtype: str) -> float:
    """Bytes per stored K or V element for a KV-cache dtype (GGML types: block bytes / block size)."""
    d = dtype.lower()
    if d in _KV_BYTES:
        return _KV_BYTES[d]
    if d in _KV_GGML:
        block, size = ggml_block(d)
        return size / block
    raise BadInput(f"no byte size known for KV-cache dtype {dtype!r}")


def kv_dtype_of(arm: Arm, model_dtype: str = "bf16") -> str:
    """The KV dtype an arm stores ('auto' -> the model's activation dtype; fp8 -> fp8)."""
    kv = arm.kv_effective(model_dtype)
    return "bf16" if kv == "auto" else kv


def kv_bytes_per_token(shape: ModelShape, kv_dtype: str, tp: int = 1) -> float:
    """K+V bytes per token across all layers (per rank under TP: KV heads are split, at least 1 per rank)."""
    heads = kv_heads_per_rank(shape, tp)
    v_dim = shape.head_dim if shape.v_head_dim is None else shape.v_head_dim
    return shape.layers * heads * (shape.head_dim + v_dim) * kv_bytes_per_element(kv_dtype)


def kv_heads_per_rank(shape: ModelShape, tp: int) -> int:
    # vLLM/SGLang replicate KV heads when tp > kv_heads, so each rank holds max(1, kv_heads // tp).
    # MLA has one latent "head" (kv_heads 1): every TP rank keeps the whole latent cache.
    return max(1, shape.kv_heads // tp)


def kv_bytes_per_token_total(shape: ModelShape, kv_dtype: str, tp: int = 1) -> float:
    """K+V bytes per token summed over the TP group (= unsplit model unless heads are replicated, as MLA's are)."""
    return kv_bytes_per_token(shape, kv_dtype, tp) * tp


def layout_notes(shape: ModelShape) -> list[str]:
    """What the layout means for the KV figures (printed beside them)."""
    notes: list[str] = []
    if shape.attention == "mla":
        notes.append(f"MLA: one {shape.head_dim}-element latent per layer and token (kv_lora_rank + "
                     "qk_rope_head_dim), the same on every TP rank")
    if shape.sliding_layers:
        notes.append(f"{shape.sliding_layers} of {shape.layers} layers use a {shape.sliding_window}-token window: "
                     "bytes/token counts every layer (the pool's unit); a request needs less")
    if shape.num_experts:
        notes.append(f"MoE: all {shape.num_experts} experts resident"
                     + (f", {shape.experts_per_token} active per token" if shape.experts_per_token else ""))
    return notes


# Weight formats an engine cannot produce from 16-bit weights at load time: they need a pre-quantized checkpoint.
_PREQUANTIZED_ONLY = {"w4a16", "nvfp4", "mxfp4"}


def checkpoint_mismatch(shape: ModelShape, arm: Arm) -> str | None:
    """Why ``arm`` cannot be served from the checkpoint ``shape`` was read from (None: it can, or no checkpoint)."""
    ckpt = shape.checkpoint
    if ckpt is None:
        return None
    fmt = ckpt.weight_format
    if fmt is None and ckpt.quant_method:
        return (f"{shape.name} is quantized with quantization_config.quant_method={ckpt.quant_method}, "
                "which quantrack cannot map to an arm's weights")
    if fmt is not None and arm.weights != fmt:
        return (f"arm {arm.name!r} wants {arm.weights} weights, but {shape.name} is a pre-quantized {fmt} "
                f"checkpoint (quantization_config.quant_method={ckpt.quant_method}); use weights={fmt} "
                "or the unquantized repository")
    if fmt is None and arm.weights in _PREQUANTIZED_ONLY:
        return (f"arm {arm.name!r} wants {arm.weights} weights, which engines load only from a pre-quantized "
                f"checkpoint; {shape.name} is unquantized ({shape.dtype}): name the quantized repository "
                "(--model ORG/NAME-AWQ ..., or the arm's own model)")
    return None


def _stored_format(shape: ModelShape) -> str:
    ckpt = shape.checkpoint
    return (ckpt.weight_format if ckpt and ckpt.weight_format else shape.dtype).lower()


def naive_weight_bytes(shape: ModelShape, fmt: str) -> float:
    """params x bytes per parameter; a checkpoint read from its headers counts its exact bytes instead when
    ``fmt`` is what it stores (a pre-quantized checkpoint's scales and 16-bit embeddings included)."""
    if shape.checkpoint is not None and fmt.lower() == _stored_format(shape):
        return float(shape.checkpoint.total_bytes)
    return shape.params * weight_bytes_per_param(fmt)


def engine_weight_bytes(shape: ModelShape, fmt: str) -> tuple[float, list[str]]:
    """Weights as GPU engines hold them: quantized body, embedding + LM head left at 16 bits.

    vLLM/SGLang quantize Linear layers only; VocabParallelEmbedding and the LM head stay bf16 (online FP8
    on the H200: 8.5 GiB logged, not 8,030,261,248 x 1 B = 7.48 GiB; reference data: vllm-h200/vllm-0.25.0-fp8.log).
    """
    f = fmt.lower()
    per = weight_bytes_per_param(f)
    notes: list[str] = []
    ckpt = shape.checkpoint
    if ckpt is not None:
        if f == _stored_format(shape):
            notes.append(f"weights: {ckpt.total_bytes:,} B from the safetensors headers ({_dtype_summary(ckpt)})"
                         + (f"; {ckpt.skipped}" if ckpt.skipped else ""))
            return float(ckpt.total_bytes), notes
        if ckpt.weight_format is None and f not in _PREQUANTIZED_ONLY:
            # online quantization of a 16-bit checkpoint: Linear weights converted, the rest loaded as stored
            converted = ckpt.quantizable_params * per
            notes.append(f"{ckpt.quantizable_params:,} Linear params at {f} ({per:g} B), the other "
                         f"{(ckpt.total_bytes - ckpt.quantizable_bytes) / GiB:.2f} GiB as stored (headers)")
            return float(ckpt.total_bytes - ckpt.quantizable_bytes + converted), notes
    if per >= 2.0 or f in _GGML_NAMES:
        return shape.params * per, notes
    emb = shape.embedding_params
    if not emb:
        notes.append("vocab/hidden size unknown: embedding + LM head counted at the quantized size")
        return shape.params * per, notes
    notes.append(f"embedding + LM head ({emb:,} params{', tied' if shape.tied_embeddings else ''}) kept at 2 bytes")
    return (shape.params - emb) * per + emb * 2.0, notes


def _dtype_summary(ckpt: Any) -> str:
    return ", ".join(f"{d} {b / GiB:.2f} GiB" for d, b in sorted(ckpt.bytes_by_dtype.items(), key=lambda x: -x[1]))


# --- the naive plan -----------------------------------------------------------------------------------------


@dataclass
class PlanRow:
    """One arm of the naive plan (plus, optionally, the engine-aware prediction beside it)."""

    arm: str
    weights_format: str
    kv_dtype: str
    weights_bytes: float
    kv_budget_bytes: float
    kv_bytes_per_token: float
    token_capacity: int
    context_len: int
    concurrency: float
    vs_baseline: float | None
    fits: bool
    notes: list[str] = field(default_factory=list)
    engine: str | None = None
    engine_tokens: int | None = None
    engine_weights_bytes: float | None = None
    engine_kv_bytes: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Stable snake_case keys for --format json/csv (documented in docs/capacity-model.md)."""
        return {
            "arm": self.arm,
            "weights_format": self.weights_format,
            "kv_dtype": self.kv_dtype,
            "weights_gib": round(self.weights_bytes / GiB, 4),
            "weights_gb": round(self.weights_bytes / 1e9, 4),
            "kv_budget_gib": round(self.kv_budget_bytes / GiB, 4),
            "kv_budget_gb": round(self.kv_budget_bytes / 1e9, 4),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "token_capacity": self.token_capacity,
            "context_len": self.context_len,
            "concurrency": round(self.concurrency, 2),
            "vs_baseline": None if self.vs_baseline is None else round(self.vs_baseline, 2),
            "fits": self.fits,
            "engine": self.engine,
            "engine_tokens": self.engine_tokens,
            "engine_weights_gib": None if self.engine_weights_bytes is None else round(self.engine_weights_bytes / GiB, 4),
            "engine_kv_gib": None if self.engine_kv_bytes is None else round(self.engine_kv_bytes / GiB, 4),
            "basis": "derived",
            "notes": "; ".join(self.notes),
        }


def _check_common(util: float, tp: int, memory_bytes: float, context_len: int | None) -> None:
    if not (0 < util <= 1):
        raise BadInput(f"--util must be in (0, 1], got {util}")
    if tp < 1:
        raise BadInput(f"--tp must be at least 1, got {tp}")
    if memory_bytes <= 0:
        raise BadInput("GPU memory must be greater than zero")
    if context_len is not None and context_len <= 0:
        raise BadInput(f"--context-len must be greater than zero, got {context_len}")


def check_shape(shape: ModelShape) -> None:
    for name in ("params", "layers", "kv_heads", "head_dim"):
        value = getattr(shape, name)
        if value is None or value <= 0:
            raise BadInput(f"model {shape.name!r}: {name} must be greater than zero, got {value}")


def plan(
    shape: ModelShape,
    memory_bytes: float,
    arms: list[Arm],
    util: float = DEFAULT_UTIL,
    overhead_bytes: float = 0,
    tp: int = 1,
    context_len: int | None = None,
) -> list[PlanRow]:
    """The seeds' arithmetic per arm; the first arm is the baseline for ``vs_baseline``.

    ``memory_bytes`` is per device; the budget is ``memory_bytes * tp * util - weights - overhead`` (weights and
    KV are summed over the TP group, as lab06 answer 1 does for 70B on 2 x 80 GiB).
    """
    if not arms:
        raise BadInput("no arms to plan")
    check_shape(shape)
    _check_common(util, tp, memory_bytes, context_len)
    if overhead_bytes < 0:
        raise BadInput("--overhead must not be negative")
    ctx = context_len or shape.max_context or 4096
    usable = memory_bytes * tp * util
    rows: list[PlanRow] = []
    for arm in arms:
        problem = checkpoint_mismatch(shape, arm)
        if problem:
            raise BadInput(problem)
        kv = kv_dtype_of(arm, shape.dtype)
        weights = naive_weight_bytes(shape, arm.weights)
        per_token = kv_bytes_per_token_total(shape, kv, tp)  # summed over ranks (== unsplit model for GQA)
        budget = usable - weights - overhead_bytes
        fits = budget > 0
        tokens = math.floor(budget / per_token) if fits else 0
        notes = [f"not modelled: {u}" for u in shape.unsupported]
        if fits and tokens < ctx:
            notes.append(f"fewer KV tokens than one {ctx}-token request")
        rows.append(PlanRow(
            arm=arm.name, weights_format=arm.weights, kv_dtype=kv, weights_bytes=weights,
            kv_budget_bytes=budget, kv_bytes_per_token=per_token, token_capacity=tokens, context_len=ctx,
            concurrency=tokens / ctx, vs_baseline=None, fits=fits, notes=notes,
        ))
    base = rows[0]
    for r in rows:
        r.vs_baseline = (r.token_capacity / base.token_capacity) if (base.fits and base.token_capacity) else None
    return rows


# --- engine-aware prediction --------------------------------------------------------------------------------

# Calibrated constants (docs/capacity-model.md says how; each is one number fitted on the real H200 logs).
# vLLM: memory counted in non_kv beyond weights + activation peak + sampler logits: non-torch growth after the
# snapshot (cuBLAS workspace, ...) and the runner's persistent buffers. Fitted on vllm-0.25.0-bf16.log.
VLLM_NON_TORCH_BYTES = int(0.60 * GiB)
# SGLang: device memory already in use before the pre-load baseline (CUDA context, torch.distributed init):
# total 143771 MiB = 140.40 GiB vs "Load weight begin. avail mem=139.09 GB" in sglang-0.5.16-bf16.log.
SGLANG_PRELOAD_USED_BYTES = int(1.31 * GiB)


def _vllm_defaults(total_bytes: float, gpu_name: str | None) -> tuple[int, int]:
    """vLLM V1 online-serving defaults: (max_num_batched_tokens, max_num_seqs).

    8192 / 1024 on GPUs with >= 70 GiB that are not A100, else 2048 / 256 (vllm tests/engine/test_arg_utils.py
    ``test_defaults_with_usage_context``, OPENAI_API_SERVER; the H200 log confirms 8192).
    """
    big = total_bytes >= 70 * GiB and "a100" not in (gpu_name or "").lower()
    return (8192, 1024) if big else (2048, 256)


def _sglang_defaults(total_mib: float, tp: int) -> tuple[int, int]:
    """SGLang's GPU-memory tiers: (chunked_prefill_size, decode cuda_graph_max_bs) (server_args)."""
    small_tp = tp < 4
    if total_mib < 20 * 1024:
        return 2048, 8
    if total_mib < 35 * 1024:
        return 2048, 24 if small_tp else 80
    if total_mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if total_mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def sglang_prefill_graph_sizes(max_tokens: int) -> list[int]:
    """Prefill CUDA-graph token sizes as logged by SGLang 0.5.16 on the H200 (58 sizes up to 8192)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, 16385, 512)))
    return [s for s in sizes if s <= max_tokens]


def sglang_default_mem_fraction(total_bytes: float, tp: int = 1, chunked_prefill_size: int | None = None,
                                cuda_graph_max_bs: int | None = None, *, mla: bool = False) -> float:
    """Default --mem-fraction-static (engine-facts §4.3, memory_hook.py L281-L327): 0.903 on the H200.

    ``reserve_for_graph_mb``: decode ``max_bs * 2`` plus prefill ``len(sizes) * 8`` MiB, or 1.5 GiB for MLA
    models (memory_hook.py L357-L395).
    """
    total_mib = total_bytes / MiB
    chunk, max_bs = _sglang_defaults(total_mib, tp)
    chunk = chunked_prefill_size or chunk
    max_bs = cuda_graph_max_bs or max_bs
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024
    reserved += max_bs * 2 + (1536 if mla else len(sglang_prefill_graph_sizes(chunk)) * 8)  # reserve_for_graph_mb
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((total_mib - reserved) / total_mib, 3)


@dataclass
class ShareBasis:
    """What every GPU-memory-share engine's prediction starts from (``share_basis``)."""

    ctx: int
    weights: float  # per rank
    per_token: float  # KV bytes per token, per rank
    naive: int  # the naive plan's tokens
    assumptions: list[str]


def share_basis(shape: ModelShape, gpu_memory_bytes: float, arm: Arm, kv: str, s: CapacitySettings) -> ShareBasis:
    """Context, per-rank weights and KV bytes per token, the naive plan's tokens and the shared assumptions of an
    engine that takes a share of each GPU's memory (vLLM, SGLang)."""
    ctx = s.context_len or shape.max_context or 4096
    weights_total, w_notes = engine_weight_bytes(shape, arm.weights)
    naive = plan(shape, gpu_memory_bytes, [arm], util=s.util or DEFAULT_UTIL, tp=s.tp, context_len=ctx)[0].token_capacity
    assumptions = list(w_notes) + [f"not modelled: {u}" for u in shape.unsupported]
    if s.tp > 1:
        assumptions.append(f"TP {s.tp}: weights split evenly; {kv_heads_per_rank(shape, s.tp)} KV head(s) per rank; "
                           "NCCL buffers not modelled")
    return ShareBasis(ctx, weights_total / s.tp, kv_bytes_per_token(shape, kv, s.tp), naive, assumptions)


def predict_engine(
    shape: ModelShape,
    gpu_memory_bytes: float,
    arm: Arm,
    engine: str = DEFAULT_ENGINE,
    util: float | None = None,
    context_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    tp: int = 1,
    *,
    max_num_seqs: int | None = None,
    gpu_name: str | None = None,
    block_size: int = 16,
    page_size: int = 1,
    n_parallel: int = 1,
    kv_unified: bool = False,
    reserve_bytes: float | None = None,
    kv_cache_memory_bytes: float | None = None,
) -> EnginePrediction:
    """Predict the engine's KV capacity for one arm on one GPU (per-device memory ``gpu_memory_bytes``): the
    engine's adapter owns its reservation model (``EngineAdapter.predict_capacity``).

    ``reserve_bytes`` replaces the engine's one calibrated constant (vLLM ``VLLM_NON_TORCH_BYTES``, SGLang
    ``SGLANG_PRELOAD_USED_BYTES``): out-of-sample validation refits it without the log it then predicts.
    ``kv_cache_memory_bytes``: vLLM's ``--kv-cache-memory-bytes``, which replaces the whole profile
    (``Worker.determine_available_memory`` returns it, ignoring gpu_memory_utilization:
    vllm@4ba787ec9:vllm/v1/worker/gpu_worker.py:L656-L681, engine-facts §3).
    """
    check_shape(shape)
    if engine not in ENGINES:
        raise BadInput(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if util is not None:
        _check_common(util, tp, gpu_memory_bytes, context_len)
    else:
        _check_common(0.5, tp, gpu_memory_bytes, context_len)
    if shape.params_exact:
        # engines load every parameter: use the exact count where the catalog keeps a seed's rounded one
        shape = replace(shape, params=float(shape.params_exact))
    kv = kv_dtype_of(arm, shape.dtype)
    problem = checkpoint_mismatch(shape, arm)
    if problem:
        raise BadInput(problem)
    settings = CapacitySettings(util=util, context_len=context_len, max_num_batched_tokens=max_num_batched_tokens,
                                tp=tp, max_num_seqs=max_num_seqs, gpu_name=gpu_name, block_size=block_size,
                                page_size=page_size, n_parallel=n_parallel, kv_unified=kv_unified,
                                reserve_bytes=reserve_bytes, kv_cache_memory_bytes=kv_cache_memory_bytes)
    return get_adapter(engine).predict_capacity(shape, gpu_memory_bytes, arm, kv, settings)


def no_fixed_kv_memory(engine: str, s: CapacitySettings) -> None:
    """An engine without vLLM's --kv-cache-memory-bytes refuses one (BadInput)."""
    if s.kv_cache_memory_bytes is not None:
        raise BadInput(f"kv_cache_memory_bytes is vLLM's --kv-cache-memory-bytes; {engine} has no such setting")


def predict_vllm(engine: str, shape: ModelShape, arm: Arm, kv: str, total: float, s: CapacitySettings,
                 b: ShareBasis) -> EnginePrediction:
    """vLLM V1's KV budget: ceil(total x util) less weights, the profile run's activation peak, the sampler's
    logits and the non-torch memory, in blocks (vLLM's adapter: ``predict_capacity``)."""
    util = DEFAULT_UTIL if s.util is None else s.util
    ctx, weights, per_token, naive, assumptions = b.ctx, b.weights, b.per_token, b.naive, b.assumptions
    mnbt, mns, tp, gpu_name, block_size = s.max_num_batched_tokens, s.max_num_seqs, s.tp, s.gpu_name, s.block_size
    non_torch = VLLM_NON_TORCH_BYTES if s.reserve_bytes is None else s.reserve_bytes
    fixed_kv = s.kv_cache_memory_bytes
    d_tokens, d_seqs = _vllm_defaults(total, gpu_name)
    tokens_batched = mnbt or d_tokens
    seqs = mns or d_seqs
    requested = math.ceil(total * util)  # vllm gpu_worker: ceil(total_memory * gpu_memory_utilization)
    hidden = shape.hidden_size or shape.attention_heads and shape.attention_heads * shape.head_dim or 0
    inter = shape.intermediate_size or 4 * hidden
    vocab = shape.vocab_size or 0
    if shape.num_experts and shape.experts_per_token and shape.moe_intermediate_size:
        # fused MoE at the profile run: per token and chosen expert a gate_up output (2N), the activation (N)
        # and the down output (H), N = moe_intermediate_size / tp (vllm fused_moe intermediate caches 1-3),
        # plus residual and hidden stream (2H). Not calibrated on an MoE log.
        activation = tokens_batched * (shape.experts_per_token * (3 * shape.moe_intermediate_size / tp + hidden)
                                       + 2 * hidden) * 2
        assumptions.append("MoE activation peak: fused-MoE intermediate caches at max_num_batched_tokens "
                           "(derived, not calibrated); experts split by TP, expert parallelism not modelled")
    else:
        # profile_run at max_num_batched_tokens, bf16 activations: gate_up output (2I) + activation output (I)
        # per rank, plus residual and hidden stream (2H).
        activation = tokens_batched * (3 * inter / tp + 2 * hidden) * 2
    # dummy sampler run: fp32 logits for max_num_seqs requests over the full vocabulary.
    sampler = seqs * vocab * 4
    kv_bytes = requested - weights - activation - sampler - non_torch
    if fixed_kv is not None:  # --kv-cache-memory-bytes: the profile's figure is replaced by the user's
        kv_bytes = float(fixed_kv)
        assumptions.append(f"--kv-cache-memory-bytes {int(fixed_kv)}: KV memory fixed per worker, "
                           "gpu_memory_utilization and the profile do not set it")
    extra_settings: dict[str, Any] = {}
    if shape.sliding_layers:
        tokens, blocks, rounding, extra_settings = _vllm_hybrid_tokens(shape, kv_bytes, per_token, block_size,
                                                                       ctx, tokens_batched, assumptions)
    else:
        page = per_token * block_size
        blocks = max(0, int(kv_bytes // page))
        tokens = blocks * block_size
        rounding = max(0.0, kv_bytes - blocks * page)
    if shape.attention == "mla":
        assumptions.append("MLA: vLLM's MLA backends use their own block size (FlashMLA 64); block rounding at "
                           f"{block_size} is an approximation")
    if ctx % block_size:
        assumptions.append("context length not a multiple of the block size: concurrency rounds per block")
    assumptions += [
        (f"vLLM V1 (0.25.0 V2 model runner): requested = ceil(total x {util}); CUDA graphs captured after KV "
        "sizing, so outside this budget (no 'Estimated CUDA graph memory' line in the H200 logs)"),
        f"max_num_batched_tokens {tokens_batched}, max_num_seqs {seqs}"
        + (" (vLLM online-serving defaults for this GPU)" if not (mnbt or mns) else ""),
        f"non-torch + persistent buffers {non_torch / GiB:.2f} GiB"
        + (": calibrated on one H200 log" if non_torch == VLLM_NON_TORCH_BYTES else " (given)"),
        f"blocks of {block_size} tokens",
    ]
    return EnginePrediction(
        engine=engine, arm=arm.name, kv_dtype=kv, naive_tokens=naive, engine_tokens=tokens,
        weights_bytes=weights, kv_bytes=max(0.0, kv_bytes), kv_bytes_per_token=per_token,
        reserved={"activation_peak": activation, "sampler_logits": sampler, "non_torch": non_torch,
                  "cuda_graphs": 0.0, "block_rounding": rounding, "headroom_1_minus_util": total - requested},
        settings={"util": util, "max_num_batched_tokens": tokens_batched, "max_num_seqs": seqs,
                  "block_size": block_size, "tp": tp, "requested_bytes": requested, **extra_settings},
        assumptions=assumptions, context_len=ctx,
    )


def _vllm_hybrid_tokens(shape: ModelShape, kv_bytes: float, per_token: float, block_size: int, max_model_len: int,
                        max_num_batched_tokens: int, assumptions: list[str]) -> tuple[int, int, float, dict[str, Any]]:
    """(logged tokens, blocks, rounding bytes, settings) for a sliding/full hybrid under vLLM's hybrid allocator.

    Layers are grouped by type into groups of equal size (the smaller type's count, or the larger one when it is
    under 1.5x the smaller), one block id spanning one layer of every group slot:
    ``num_blocks = kv_bytes // (page_bytes_per_layer * group_size)`` (vllm@fc23e695
    vllm/v1/core/kv_cache_planning.py ``_get_kv_cache_groups_uniform_page_size``, ``_pool_bytes_per_block``).
    "GPU KV cache size: N tokens" is ``int(max_concurrency * max_model_len)`` with ``max_concurrency =
    num_blocks / sum over groups of blocks one max_model_len request needs``; a sliding group needs
    ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1`` (SlidingWindowSpec
    ``max_memory_usage_bytes``), a full group ``cdiv(max_model_len, block_size)``. vLLM <= 0.11 logged
    ``num_blocks // len(groups) * block_size`` instead (engine-facts §4.2), kept in the settings.
    """
    full, sliding = shape.layers - shape.sliding_layers, shape.sliding_layers
    counts = [c for c in (full, sliding) if c]
    group = min(counts)
    if max(counts) < 1.5 * group:
        group = max(counts)
    full_groups, sliding_groups = math.ceil(full / group) if full else 0, math.ceil(sliding / group)
    groups = full_groups + sliding_groups
    page_per_layer = per_token / shape.layers * block_size
    bytes_per_block = page_per_layer * group
    blocks = max(0, int(kv_bytes // bytes_per_block))
    window = shape.sliding_window or max_model_len
    per_request = (full_groups * math.ceil(max_model_len / block_size)
                   + sliding_groups * (math.ceil(min(window - 1 + max_num_batched_tokens, max_model_len)
                                                 / block_size) + 1))
    tokens = int(blocks / per_request * max_model_len) if per_request else 0
    legacy = blocks // groups * block_size
    assumptions.append(
        f"hybrid KV: {full} full + {sliding} sliding-window ({window}) layers in {groups} groups of {group}; "
        f"{blocks:,} blocks; 'GPU KV cache size' = max_concurrency x max_model_len ({max_model_len}) = {tokens:,} "
        f"(vLLM <= 0.11 logged num_blocks // groups x block_size = {legacy:,})")
    return tokens, blocks, max(0.0, kv_bytes - blocks * bytes_per_block), {
        "kv_groups": groups, "kv_group_size": group, "kv_blocks": blocks, "legacy_v011_tokens": legacy,
        "pool_tokens_all_layers": int(kv_bytes // per_token)}


def predict_sglang(engine: str, shape: ModelShape, arm: Arm, kv: str, total: float, s: CapacitySettings,
                   b: ShareBasis) -> EnginePrediction:
    """SGLang's KV pool: the free memory after the weights less (1 - mem_fraction_static) of the memory free
    before them, in pages (SGLang's adapter: ``predict_capacity``)."""
    no_fixed_kv_memory(engine, s)
    mfs, chunk, tp, page_size = s.util, s.max_num_batched_tokens, s.tp, s.page_size
    ctx, weights, per_token, naive, assumptions = b.ctx, b.weights, b.per_token, b.naive, b.assumptions
    preload_used = SGLANG_PRELOAD_USED_BYTES if s.reserve_bytes is None else s.reserve_bytes
    chunk_default, max_bs = _sglang_defaults(total / MiB, tp)
    chunk = chunk or chunk_default
    given = mfs is not None
    mfs = mfs if mfs is not None else sglang_default_mem_fraction(total, tp, chunk, max_bs,
                                                                  mla=shape.attention == "mla")
    pre_free = total - preload_used
    # kv_cache_configurator: rest = free_after_load - pre_load_free * (1 - mem_fraction_static)
    rest = (pre_free - weights) - pre_free * (1 - mfs)
    raw = int(rest // per_token) if rest > 0 else 0
    tokens = raw // page_size * page_size
    hybrid: dict[str, Any] = {}
    if shape.sliding_layers:
        tokens, hybrid = _sglang_swa_tokens(shape, raw, page_size, assumptions)
    assumptions += [
        f"SGLang: mem_fraction_static {mfs}" + ("" if given else " (default formula, memory_hook)"),
        f"memory in use before the weights {preload_used / GiB:.2f} GiB"
        + (": calibrated on one H200 log" if preload_used == SGLANG_PRELOAD_USED_BYTES else " (given)"),
        "weights = free-memory delta at load; allocator slack after online quantization not modelled",
        f"chunked_prefill_size {chunk}, decode cuda_graph_max_bs {max_bs}, page size {page_size}",
    ]
    return EnginePrediction(
        engine=engine, arm=arm.name, kv_dtype=kv, naive_tokens=naive, engine_tokens=tokens,
        weights_bytes=weights, kv_bytes=max(0.0, rest), kv_bytes_per_token=per_token,
        reserved={"preload_used": float(preload_used), "runtime_slack": pre_free * (1 - mfs),
                  "page_rounding": max(0.0, rest - raw // page_size * page_size * per_token)},
        settings={"mem_fraction_static": mfs, "chunked_prefill_size": chunk, "cuda_graph_max_bs": max_bs,
                  "page_size": page_size, "tp": tp, **hybrid},
        assumptions=assumptions, context_len=ctx,
    )


SGLANG_SWA_FULL_TOKENS_RATIO = 0.8  # server_args.swa_full_tokens_ratio default


def _sglang_swa_tokens(shape: ModelShape, raw: int, page_size: int,
                       assumptions: list[str]) -> tuple[int, dict[str, Any]]:
    """(logged max_total_num_tokens, settings) for SGLang's hybrid sliding-window pool.

    ``ModelRunner.set_num_token_hybrid`` (python/sglang/srt/model_executor/model_runner.py, as read in public copies
    of 2025-2026 versions): the pool profiled for every layer at ``raw`` tokens is re-split so that
    ``swa_tokens * swa_layers + full_tokens * full_layers == raw * num_layers`` with ``swa_tokens = ratio *
    full_tokens`` (``swa_full_tokens_ratio``, default 0.8), both page-aligned; ``max_total_num_tokens`` is then the
    full-attention layers' count. Not checked against an SGLang log of a sliding-window model.
    """
    full_layers = shape.layers - shape.sliding_layers
    ratio = SGLANG_SWA_FULL_TOKENS_RATIO
    full = int(raw * shape.layers / (ratio * shape.sliding_layers + full_layers))
    swa = int(full * ratio)
    full, swa = full // page_size * page_size, swa // page_size * page_size
    assumptions.append(f"hybrid SWA pool (disable_hybrid_swa_memory off): {full_layers} full-attention layers get "
                       f"{full:,} tokens, {shape.sliding_layers} sliding ({shape.sliding_window}) layers {swa:,} "
                       f"(swa_full_tokens_ratio {ratio}); max_total_num_tokens = the full layers' {full:,}; "
                       "not checked against a log")
    return full, {"full_layer_tokens": full, "swa_layer_tokens": swa, "swa_full_tokens_ratio": ratio,
                  "pool_tokens_all_layers": raw}


def llamacpp_kv_bytes(shape: ModelShape, cells: int, type_k: str = "f16", type_v: str = "f16") -> tuple[int, int]:
    """(K bytes, V bytes) of llama.cpp's KV cache: n_layers x cells x row_size(type, n_embd_{k,v}_gqa).

    llama.cpp@0c1e57098:src/llama-kv-cache.cpp:L233-L234 (one 3-D tensor per layer), printed at L301.
    ``cells`` is the total over streams (kv_size x n_stream).
    """
    n_embd_k = shape.kv_heads * shape.head_dim
    n_embd_v = shape.kv_heads * (shape.v_head_dim or shape.head_dim)
    return (shape.layers * cells * ggml_row_size(type_k, n_embd_k),
            shape.layers * cells * ggml_row_size(type_v, n_embd_v))


def llamacpp_cells(n_ctx: int, n_parallel: int = 1, kv_unified: bool = False) -> tuple[int, int]:
    """(cells per stream, streams): one stream of n_ctx cells when unified, else n_parallel of n_ctx/n_parallel.

    Seen in xllamacpp 2026.10.11549 (engine-facts §1.5): n_ctx 2048, 4 slots -> "512 cells, 4/4 seqs".
    Padding of n_ctx is not modelled (both real configurations used multiples of 256).
    """
    if n_ctx <= 0 or n_parallel <= 0:
        raise BadInput("n_ctx and n_parallel must be greater than zero")
    if kv_unified or n_parallel == 1:
        return n_ctx, 1
    return n_ctx // n_parallel, n_parallel


def _ggml_kv_type(kv: str) -> str:
    return {"bf16": "f16", "fp16": "f16", "auto": "f16", "fp32": "f32"}.get(kv, kv)


def predict_llamacpp(engine: str, shape: ModelShape, arm: Arm, kv: str, s: CapacitySettings) -> EnginePrediction:
    """llama.cpp's KV cache: every cell of the context allocated up front, split into streams (llama.cpp's
    adapter: ``predict_capacity``)."""
    kv_unified = s.kv_unified
    n_ctx = s.context_len or shape.max_context or 4096
    per_stream, streams = llamacpp_cells(n_ctx, s.n_parallel, kv_unified)
    cells = per_stream * streams
    t = _ggml_kv_type(kv)
    if t not in _KV_GGML:
        raise BadInput(f"llama.cpp has no KV-cache type {kv!r}; use one of {', '.join(sorted(_KV_GGML))}")
    k_bytes, v_bytes = llamacpp_kv_bytes(shape, cells, t, t)
    weights = naive_weight_bytes(shape, arm.weights)
    return EnginePrediction(
        engine=engine, arm=arm.name, kv_dtype=t, naive_tokens=cells, engine_tokens=cells,
        weights_bytes=weights, kv_bytes=float(k_bytes + v_bytes),
        kv_bytes_per_token=(k_bytes + v_bytes) / cells, reserved={"k_bytes": float(k_bytes), "v_bytes": float(v_bytes)},
        settings={"n_ctx": n_ctx, "cells_per_stream": per_stream, "streams": streams, "type_k": t, "type_v": t},
        assumptions=["llama.cpp allocates the whole KV cache up front: size is exact, not a budget residual",
                     f"{streams} stream(s) of {per_stream} cells (kv_unified={str(kv_unified).lower()})",
                     "weights: every tensor at the file type's size (real GGUF files mix types per tensor)"],
        context_len=per_stream,
    )


KV_CACHE_MEMORY_FLAG = "--kv-cache-memory-bytes"


def kv_cache_memory_bytes_in(args: list[str] | tuple[str, ...]) -> int | None:
    """vLLM's ``--kv-cache-memory-bytes N`` (or ``=N``) in an engine argv, the last one winning as in argparse;
    None when absent. A value that is not a plain positive integer is refused (BadInput), never guessed."""
    found: str | None = None
    for i, a in enumerate(args):
        if a == KV_CACHE_MEMORY_FLAG:
            if i + 1 >= len(args):
                raise BadInput(f"{KV_CACHE_MEMORY_FLAG} in the engine args has no value")
            found = args[i + 1]
        elif a.startswith(KV_CACHE_MEMORY_FLAG + "="):
            found = a.split("=", 1)[1]
    if found is None:
        return None
    if not found.isdigit() or int(found) <= 0:
        raise BadInput(f"{KV_CACHE_MEMORY_FLAG} {found!r} in the engine args: expected a positive integer of bytes")
    return int(found)


@dataclass
class ArmPrediction:
    """Naive plan + engine-aware prediction for one arm (derived), as ``predict_for_arm`` returns it.

    An engine that takes a share of GPU memory has the naive plan beside it (``naive_*``, ``fits``, per-rank
    GiB); one that allocates what it needs (llama.cpp: ``whole_cache``) has the KV cache's exact bytes and the
    naive weights, and no naive token figure. ``to_dict()`` is the flat dict preflight prints."""

    arm: str
    engine: str
    prediction: EnginePrediction
    engine_tokens: int
    whole_cache: bool = False
    kv_dtype: str | None = None
    naive_tokens: int | None = None
    naive_weights_gib: float | None = None
    naive_kv_budget_gib: float | None = None
    fits: bool | None = None
    engine_weights_gib: float | None = None
    engine_kv_gib: float | None = None
    engine_max_concurrency: float | None = None
    context_len: int | None = None
    engine_kv_bytes: float | None = None
    engine_kv_mib: float | None = None
    weights_naive_gib: float | None = None
    basis: str = "derived"

    def to_dict(self) -> dict[str, Any]:
        if self.whole_cache:
            return {"arm": self.arm, "engine": self.engine, "naive_tokens": None, "engine_tokens": self.engine_tokens,
                    "engine_kv_bytes": self.engine_kv_bytes, "engine_kv_mib": self.engine_kv_mib,
                    "weights_naive_gib": self.weights_naive_gib, "prediction": self.prediction.to_dict(),
                    "basis": self.basis}
        return {"arm": self.arm, "engine": self.engine, "kv_dtype": self.kv_dtype, "naive_tokens": self.naive_tokens,
                "naive_weights_gib": self.naive_weights_gib, "naive_kv_budget_gib": self.naive_kv_budget_gib,
                "fits": self.fits, "engine_tokens": self.engine_tokens, "engine_weights_gib": self.engine_weights_gib,
                "engine_kv_gib": self.engine_kv_gib, "engine_max_concurrency": self.engine_max_concurrency,
                "context_len": self.context_len, "prediction": self.prediction.to_dict(), "basis": self.basis}


def whole_cache_prediction(arm: Arm, engine: str, pred: EnginePrediction) -> ArmPrediction:
    """An ArmPrediction for an engine that allocates its whole KV cache at start (exact bytes, no budget)."""
    return ArmPrediction(arm=arm.name, engine=engine, prediction=pred, engine_tokens=pred.engine_tokens,
                         whole_cache=True, engine_kv_bytes=pred.kv_bytes, engine_kv_mib=round(pred.kv_bytes / MiB, 2),
                         weights_naive_gib=round(pred.weights_bytes / GiB, 4))


def predict_for_arm(
    shape: ModelShape,
    gpu: GPU | float,
    arm: Arm,
    engine: str = DEFAULT_ENGINE,
    util: float | None = None,
    context_len: int | None = None,
    tp: int = 1,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    gpu_name: str | None = None,
    kv_cache_memory_bytes: float | None = None,
) -> ArmPrediction:
    """Naive plan + engine-aware prediction for one arm (used by preflight, logs reconcile, run).

    ``gpu`` is a catalog GPU (its device-reported total is used) or a per-device size in bytes; with a size,
    ``gpu_name`` may name the device (vLLM's defaults depend on it). ``max_num_batched_tokens`` /
    ``max_num_seqs``: the settings vLLM profiles with (None: its defaults for this GPU).
    """
    share = get_adapter(engine).memory.gpu_share if engine in ENGINES else True
    if isinstance(gpu, GPU):
        if gpu.vendor == "cpu" and share:
            raise BadInput(f"{gpu.name} has no fixed memory; give a memory size instead")
        total, gpu_name = float(gpu.total_bytes), gpu.name
    else:
        total = float(gpu)
    if not share:
        return whole_cache_prediction(arm, engine, predict_engine(shape, total or 1.0, arm, engine,
                                                                  context_len=context_len))
    row = plan(shape, total, [arm], util=util if util is not None else DEFAULT_UTIL, tp=tp, context_len=context_len)[0]
    pred = predict_engine(shape, total, arm, engine, util=util, context_len=row.context_len, tp=tp, gpu_name=gpu_name,
                          max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                          kv_cache_memory_bytes=kv_cache_memory_bytes)
    return ArmPrediction(
        arm=arm.name, engine=engine, prediction=pred, engine_tokens=pred.engine_tokens, kv_dtype=pred.kv_dtype,
        naive_tokens=row.token_capacity, naive_weights_gib=round(row.weights_bytes / GiB, 4),
        naive_kv_budget_gib=round(row.kv_budget_bytes / GiB, 4), fits=row.fits and pred.engine_tokens > 0,
        engine_weights_gib=round(pred.weights_bytes / GiB, 4), engine_kv_gib=round(pred.kv_bytes / GiB, 4),
        engine_max_concurrency=None if pred.max_concurrency is None else round(pred.max_concurrency, 2),
        context_len=row.context_len)


# --- the `plan` command's one object and one call -----------------------------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    """Everything ``quantrack plan`` needs, validated by whoever builds it."""

    shape: ModelShape
    memory_bytes: float  # per device
    memory_label: str  # how the memory was given, for the title ("24 GiB (--vram; bare number = GiB)")
    arms: tuple[Arm, ...]
    util: float | None = None  # None: DEFAULT_UTIL for the naive plan, the engine's own default for --engine
    overhead_bytes: float = 0
    tp: int = 1
    context_len: int = 4096
    engine: str | None = None
    gpu_name: str | None = None
    decimal: bool = False  # show GB (1e9) instead of GiB
    max_num_batched_tokens: int | None = None  # vLLM's profile settings for --engine vllm (None: its defaults)
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None  # vLLM's --kv-cache-memory-bytes for --engine vllm (replaces the profile)

    def title(self) -> str:
        unit = "GB (decimal, 1e9 B)" if self.decimal else "GiB (2^30 B)"
        parts = [f"Capacity plan for {self.shape.name}: derived, not measured",
                 f"memory {self.memory_label}" + (f" x TP {self.tp}" if self.tp > 1 else ""),
                 f"util {self.util if self.util is not None else DEFAULT_UTIL}",
                 f"context {self.context_len}", f"sizes in {unit}"]
        if self.overhead_bytes:
            parts.append(f"overhead {self.overhead_bytes / (1e9 if self.decimal else GiB):g} "
                         f"{'GB' if self.decimal else 'GiB'}")
        if self.shape.params_estimated:
            parts.append("params estimated from shapes")
        return "; ".join(parts)


def run_plan(req: PlanRequest) -> list[PlanRow]:
    """Naive rows for every arm; with ``req.engine`` set, the engine-aware prediction beside each."""
    rows = plan(req.shape, req.memory_bytes, list(req.arms), util=req.util if req.util is not None else DEFAULT_UTIL,
                overhead_bytes=req.overhead_bytes, tp=req.tp, context_len=req.context_len)
    if req.engine:
        for row, arm in zip(rows, req.arms, strict=True):
            pred = predict_engine(req.shape, req.memory_bytes, arm, req.engine, util=req.util,
                                  context_len=req.context_len, tp=req.tp, gpu_name=req.gpu_name,
                                  max_num_batched_tokens=req.max_num_batched_tokens, max_num_seqs=req.max_num_seqs,
                                  kv_cache_memory_bytes=req.kv_cache_memory_bytes)
            row.engine = req.engine
            row.engine_tokens = pred.engine_tokens
            # weights per rank x ranks where the engine splits them (a GPU-share engine's TP)
            row.engine_weights_bytes = pred.weights_bytes * (req.tp if get_adapter(req.engine).memory.gpu_share else 1)
            row.engine_kv_bytes = pred.kv_bytes
    return rows


__all__ = [
    "W4A16_GROUP_OVERHEAD",
    "ArmPrediction",
    "CapacitySettings",
    "EnginePrediction",
    "PlanRow",
    "engine_weight_bytes",
    "kv_bytes_per_element",
    "kv_bytes_per_token",
    "llamacpp_cells",
    "llamacpp_kv_bytes",
    "naive_weight_bytes",
    "plan",
    "predict_engine",
    "predict_for_arm",
    "predict_llamacpp",
    "predict_sglang",
    "predict_vllm",
    "sglang_default_mem_fraction",
    "share_basis",
    "weight_bytes_per_param",
]
