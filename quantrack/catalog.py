"""GPU and model catalogs, read from ``rules/gpus.toml`` and ``rules/models.toml``.

Each entry carries a ``source``. Names are matched case-insensitively against the name and
its aliases; an unknown name is a one-line error with a did-you-mean.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, unknown
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

    @property
    def cc_int(self) -> int | None:
        """Compute capability as major*10+minor (the engines' convention), None if not NVIDIA."""
        return None if self.compute_capability is None else self.compute_capability[0] * 10 + self.compute_capability[1]


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

    @property
    def kv_bytes_per_token_per_byte(self) -> int:
        """K and V elements per token across all layers (multiply by bytes per element)."""
        return 2 * self.layers * self.kv_heads * self.head_dim


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"cannot read catalog {path.name}: {exc}") from None


@lru_cache(maxsize=None)
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
            notes=e.get("notes", ""),
        ))
    return tuple(out)


@lru_cache(maxsize=None)
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
        ))
    return tuple(out)


def _norm(s: str) -> str:
    return s.lower().replace("_", "-").replace(" ", "-")


def get_gpu(name: str) -> GPU:
    key = _norm(name)
    for g in gpus():
        if key == _norm(g.name) or key in (_norm(a) for a in g.aliases):
            return g
    raise unknown("GPU", name, [g.name for g in gpus()], "quantrack catalog gpus")


def get_model(name: str) -> ModelShape:
    key = _norm(name)
    for m in models():
        if key == _norm(m.name) or key in (_norm(a) for a in m.aliases) or (m.hf_id and key == _norm(m.hf_id)):
            return m
    raise unknown("model", name, [m.name for m in models()], "quantrack catalog models")
