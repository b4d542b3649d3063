"""Memory sizes: parsing user strings into bytes and formatting bytes for people.

Convention (stated in every output that uses it):
- a bare number is **GiB** (2**30 bytes): ``"24"`` -> 24 GiB, as in the lab seed's ``--vram 24``;
- ``GiB``/``MiB``/``KiB``/``TiB`` are binary; ``GB``/``MB``/``KB``/``TB`` are decimal (1e9 ...), as in the
  vLLM article's ``GPU_GB = 16.0`` arithmetic;
- a lone ``G``/``M``/``K``/``T`` (``"80G"``) is **rejected** as ambiguous: vendors print GB meaning GiB-sized
  chips, engines print "GB" meaning GiB (SGLang), and guessing silently changes the answer by 7%.
"""

from __future__ import annotations

import math
import re

from quantrack.errors import BadInput

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS: dict[str, int] = {
    "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
_AMBIGUOUS = {"k", "m", "g", "t"}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_memory(text: str | float, *, what: str = "memory size", bare_unit: str = "GiB") -> int:
    """Parse ``"24"``, ``"24GiB"``, ``"16GB"``, ``"512MiB"`` into bytes (an int > 0).

    A bare number is in ``bare_unit`` (GiB by default). ``"80G"`` is rejected as ambiguous.
    """
    if isinstance(text, bool):
        raise BadInput(f"bad {what} {text!r}")
    if isinstance(text, (int, float)):
        number, unit = float(text), bare_unit.lower()
    else:
        m = _PATTERN.match(str(text))
        if not m:
            raise BadInput(f"bad {what} {text!r}: expected a number with an optional unit "
                           "(24, 24GiB, 16GB, 512MiB)")
        number, unit = float(m.group(1)), (m.group(2) or bare_unit).lower()
    if unit in _AMBIGUOUS:
        raise BadInput(f"ambiguous {what} {text!r}: write {unit.upper()}iB (binary) or {unit.upper()}B (decimal)")
    if unit not in _UNITS:
        raise BadInput(f"bad {what} {text!r}: unknown unit {unit!r}; use GiB, MiB, GB, MB (bare number = GiB)")
    if not math.isfinite(number) or number <= 0:
        raise BadInput(f"{what} must be greater than zero, got {text!r}")
    return round(number * _UNITS[unit])


def unit_of(text: str | float, bare_unit: str = "GiB") -> str:
    """The unit a memory string was written in (``"GiB"``, ``"GB"`` ...), for labelling output."""
    if isinstance(text, (int, float)):
        return bare_unit
    m = _PATTERN.match(str(text))
    if not m or not m.group(2):
        return bare_unit
    u = m.group(2).lower()
    return {"b": "B", "kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB",
            "kb": "KB", "mb": "MB", "gb": "GB", "tb": "TB"}.get(u, u)


def is_decimal(unit: str) -> bool:
    return unit.upper() in ("KB", "MB", "GB", "TB")


def to_gib(n_bytes: float) -> float:
    return n_bytes / GiB


def to_gb(n_bytes: float) -> float:
    return n_bytes / 1e9


def fmt_bytes(n_bytes: float, unit: str = "GiB", digits: int = 2) -> str:
    """``fmt_bytes(16_060_522_496) -> '14.96 GiB'``; ``unit='GB'`` -> decimal."""
    scale = _UNITS[unit.lower()]
    return f"{n_bytes / scale:,.{digits}f} {unit}"


def fmt_int(n: float) -> str:
    """Thousands separators, as the engines print token counts (``920,192``)."""
    return f"{int(n):,}"


__all__ = [
    "GiB",
    "KiB",
    "MiB",
    "TiB",
    "fmt_bytes",
    "fmt_int",
    "is_decimal",
    "parse_memory",
    "to_gb",
    "to_gib",
    "unit_of",
]
