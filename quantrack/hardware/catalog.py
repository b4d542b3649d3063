"""GPU and model catalogs, read from ``rules/gpus.toml`` and ``rules/models.toml``.

Each entry carries a ``source``. Names are matched case-insensitively against the name and
its aliases; an unknown name is a one-line error with a did-you-mean.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, NotFound, unknown
from quantrack.resources import rules_dir


@dataclass(frozen=True)
class GPU:
    name: str
    vendor: str  # nvidia | amd | cpu
    memory_gib: float  # per device, binary GiB as the vendor's marketing GB converted, see source
    aliases: tuple[str, ...] = ()
    arch: str = ""  # volta | turing | ampere | ada | hopper | blackwell | cdna2 | cdna3 | x86
    compute_capability: tuple[int, int] | None = None  # NVIDIA only
    gfx: str | None = None  # AMD only, e.g. gfx942
    bandwidth_gbs: float | None = None  # memory bandwidth, GB/s (decimal)
    source: str = ""
    notes: str = ""
    nvml_total_mib: int | None = None  # what NVML reports as total, where known (engines size from it)

    @property
    def total_bytes(self) -> int:
        """Device memory the engines budget against: NVML's total when known, else ``memory_gib``."""
        if self.nvml_total_mib:
            return int(self.nvml_total_mib) * 1024**2
        return round(self.memory_gib * 1024**3)

    @property
    def memory_basis(self) -> str:
        """Says which of the two figures ``total_bytes`` used (printed beside derived numbers)."""
        if self.nvml_total_mib:
            return f"{self.name}: NVML total {self.nvml_total_mib:,} MiB = {self.nvml_total_mib / 1024:.2f} GiB"
        return f"{self.name}: {self.memory_gib:g} GiB (vendor capacity, binary)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "vendor": self.vendor, "arch": self.arch,
            "compute_capability": (f"{self.compute_capability[0]}.{self.compute_capability[1]}"
                                   if self.compute_capability else None),
            "gfx": self.gfx, "memory_gib": self.memory_gib, "nvml_total_mib": self.nvml_total_mib,
            "bandwidth_gbs": self.bandwidth_gbs, "aliases": list(self.aliases), "source": self.source,
            "notes": self.notes,
        }

    @property
    def cc_int(self) -> int | None:
        """Compute capability as major*10+minor (the engines' convention), None if not NVIDIA."""
        return None if self.compute_capability is None else self.compute_capability[0] * 10 + self.compute_capability[1]


@dataclass(frozen=True)
class CheckpointWeights:
    """What a checkpoint's safetensors headers say it stores (exact bytes, no weights downloaded).

    ``bytes_by_dtype`` is over the tensors the engine loads; tensors it skips (DeepSeek's MTP layer
    beyond ``num_hidden_layers``) are in ``skipped_bytes``. ``logical_params`` counts weights, unpacking
    packed int4 (x8 per I32) and FP4 blocks (x2 per U8) and leaving out scales / zero points.
    """

    bytes_by_dtype: dict[str, int]
    total_bytes: int  # bytes the engine loads
    logical_params: int
    tensors: int
    embedding_bytes: int = 0  # embed_tokens + lm_head as stored
    quantizable_params: int = 0  # 16-bit Linear weights an online-quantizing engine would convert
    quantizable_bytes: int = 0  # their bytes as stored
    other_bytes: int = 0  # everything else as stored (embeddings, norms, router, biases, scales)
    skipped_bytes: int = 0
    skipped: str = ""  # what was skipped and why
    weight_format: str | None = None  # the checkpoint's arm weights format (from quantization_config)
    quant_method: str | None = None  # quantization_config.quant_method as written
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_by_dtype": dict(self.bytes_by_dtype), "total_bytes": self.total_bytes,
                "logical_params": self.logical_params, "tensors": self.tensors,
                "embedding_bytes": self.embedding_bytes, "quantizable_params": self.quantizable_params,
                "skipped_bytes": self.skipped_bytes, "skipped": self.skipped, "weight_format": self.weight_format,
                "quant_method": self.quant_method, "source": self.source}


@dataclass(frozen=True)
class ModelShape:
    """What capacity arithmetic needs from a model; layouts not modelled are flagged, not guessed."""

    name: str
    params: float  # total parameter count
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int | None = None
    vocab_size: int | None = None
    attention_heads: int | None = None
    intermediate_size: int | None = None
    tied_embeddings: bool = False
    dtype: str = "bf16"
    max_context: int | None = None
    aliases: tuple[str, ...] = ()
    hf_id: str | None = None
    source: str = ""
    unsupported: tuple[str, ...] = ()  # e.g. ("sliding_window",) -> capacity says so plainly
    extra: dict[str, Any] = field(default_factory=dict)
    params_exact: int | None = None  # exact count from the shapes when ``params`` is a seed's rounded value
    params_estimated: bool = False  # True when params came from shapes arithmetic, not a published count
    v_head_dim: int | None = None  # None = same as head_dim
    # layouts beyond dense GQA (all additive; None/0 = plain full attention on every layer)
    attention: str = "gqa"  # "gqa" | "mla" (one latent of head_dim per layer, v_head_dim 0, shared by TP ranks)
    sliding_window: int | None = None  # window of the sliding layers (hybrid models)
    sliding_layers: int = 0  # how many of ``layers`` use that window
    num_experts: int | None = None  # routed experts per MoE layer (all resident)
    experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    checkpoint: CheckpointWeights | None = None  # exact bytes from the safetensors headers, when read
    revision: str | None = None  # the Hub commit the config and headers came from

    @property
    def embedding_params(self) -> int:
        """Parameters in the input embedding plus the LM head (once if tied); 0 when vocab/hidden unknown."""
        if not self.vocab_size or not self.hidden_size:
            return 0
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "params": self.params, "params_exact": self.params_exact,
            "params_estimated": self.params_estimated, "layers": self.layers, "kv_heads": self.kv_heads,
            "head_dim": self.head_dim, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
            "attention_heads": self.attention_heads, "intermediate_size": self.intermediate_size,
            "tied_embeddings": self.tied_embeddings, "dtype": self.dtype, "max_context": self.max_context,
            "aliases": list(self.aliases), "hf_id": self.hf_id, "unsupported": list(self.unsupported),
            "source": self.source, "attention": self.attention, "sliding_window": self.sliding_window,
            "sliding_layers": self.sliding_layers, "num_experts": self.num_experts,
            "experts_per_token": self.experts_per_token, "revision": self.revision,
            "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
        }

    @property
    def kv_bytes_per_token_per_byte(self) -> int:
        """K and V elements per token across all layers (multiply by bytes per element)."""
        return 2 * self.layers * self.kv_heads * self.head_dim


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"cannot read catalog {path.name}: {exc}") from None


@cache
def gpus() -> tuple[GPU, ...]:
    data = _read(rules_dir() / "gpus.toml")
    out = []
    for e in data.get("gpu", []):
        cc = e.get("compute_capability")
        out.append(GPU(
            name=e["name"], vendor=e["vendor"], memory_gib=float(e["memory_gib"]),
            aliases=tuple(e.get("aliases", ())), arch=e.get("arch", ""),
            compute_capability=tuple(int(x) for x in str(cc).split(".")) if cc else None,  # type: ignore[arg-type]
            gfx=e.get("gfx"), bandwidth_gbs=e.get("bandwidth_gbs"), source=e.get("source", ""),
            notes=e.get("notes", ""), nvml_total_mib=e.get("nvml_total_mib"),
        ))
    return tuple(out)


@cache
def models() -> tuple[ModelShape, ...]:
    data = _read(rules_dir() / "models.toml")
    out = []
    for e in data.get("model", []):
        out.append(ModelShape(
            name=e["name"], params=float(e["params"]), layers=int(e["layers"]), kv_heads=int(e["kv_heads"]),
            head_dim=int(e["head_dim"]), hidden_size=e.get("hidden_size"), vocab_size=e.get("vocab_size"),
            attention_heads=e.get("attention_heads"), intermediate_size=e.get("intermediate_size"),
            tied_embeddings=bool(e.get("tied_embeddings", False)), dtype=e.get("dtype", "bf16"),
            max_context=e.get("max_context"), aliases=tuple(e.get("aliases", ())), hf_id=e.get("hf_id"),
            source=e.get("source", ""), unsupported=tuple(e.get("unsupported", ())),
            params_exact=e.get("params_exact"), v_head_dim=e.get("v_head_dim"),
            attention=e.get("attention", "gqa"), sliding_window=e.get("sliding_window"),
            sliding_layers=int(e.get("sliding_layers", 0)), num_experts=e.get("num_experts"),
            experts_per_token=e.get("experts_per_token"), moe_intermediate_size=e.get("moe_intermediate_size"),
        ))
    return tuple(out)


def _norm(s: str) -> str:
    return s.lower().replace("_", "-").replace(" ", "-")


def get_gpu(name: str) -> GPU:
    key = _norm(name)
    for g in gpus():
        if key == _norm(g.name) or key in (_norm(a) for a in g.aliases):
            return g
    raise _unknown_with_aliases("GPU", name, [(g.name, g.aliases) for g in gpus()], "quantrack catalog gpus")


def get_model(name: str) -> ModelShape:
    key = _norm(name)
    for m in models():
        if key == _norm(m.name) or key in (_norm(a) for a in m.aliases) or (m.hf_id and key == _norm(m.hf_id)):
            return m
    raise _unknown_with_aliases("model", name, [(m.name, m.aliases + ((m.hf_id,) if m.hf_id else ()))
                                                for m in models()], "quantrack catalog models")


def _unknown_with_aliases(kind: str, name: str, entries: list[tuple[str, tuple[str, ...]]],
                          list_command: str) -> BadInput:
    """did-you-mean over names *and* aliases; the suggestion is the canonical name."""
    import difflib

    canonical: dict[str, str] = {}
    for entry_name, aliases in entries:
        for spelling in (entry_name, *aliases):
            canonical.setdefault(_norm(spelling), entry_name)
    close = difflib.get_close_matches(_norm(name), list(canonical), n=1, cutoff=0.6)
    if close:
        return NotFound(f"unknown {kind} {name!r} (did you mean {canonical[close[0]]!r}?); see `{list_command}`")
    return unknown(kind, name, [], list_command)
