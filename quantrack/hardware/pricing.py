"""Cost per token: dated on-demand GPU prices (``rules/prices.toml``) times measured throughput.

A price is data with a source and a date; a cost is *derived* from a price and a *measured*
output throughput at a stated concurrency. Nothing is priced without a measured throughput:
``cost_per_million_tokens`` refuses a missing or non-positive figure rather than inventing one.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, NotFound, did_you_mean
from quantrack.resources import rules_dir

_REQUIRED = ("gpu", "usd_per_hour", "date", "source")
_KEYS = set(_REQUIRED) | {"aliases", "provider", "instance", "note"}
NOT_PRICED = "—"  # what a table shows where no measured throughput exists


@dataclass(frozen=True)
class Price:
    """One GPU's on-demand list price, per GPU per hour, with where and when it was read."""

    gpu: str
    usd_per_hour: float
    date: str
    source: str
    aliases: tuple[str, ...] = ()
    provider: str = ""
    instance: str = ""
    note: str = ""


@dataclass(frozen=True)
class PriceTable:
    prices: tuple[Price, ...]
    path: str

    def names(self) -> list[str]:
        return [p.gpu for p in self.prices]


def _norm(s: str) -> str:
    return s.strip().lower().replace("_", "-").replace(" ", "-")


def default_prices_path() -> Path:
    return rules_dir() / "prices.toml"


def load_prices(path: str | Path | None = None) -> PriceTable:
    """Read a price table (the shipped one, or ``--prices FILE``); bad entries are one-line errors."""
    from quantrack.store.files import read_regular

    p = Path(path) if path is not None else default_prices_path()
    try:  # a regular file only (a FIFO would block, /dev/zero never ends), at most 16 MiB
        data = tomllib.loads(read_regular(p, limit=16 * 2**20, what=f"prices file {str(p)!r}")
                             .decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"prices file {str(p)!r} is not valid TOML: {exc}") from None
    entries = data.get("price")
    if not isinstance(entries, list) or not entries:
        raise BadInput(f"prices file {str(p)!r}: needs at least one [[price]] table")
    out: list[Price] = []
    seen: dict[str, str] = {}
    for i, e in enumerate(entries, 1):
        where = f"prices file {str(p)!r}: [[price]] #{i}"
        if not isinstance(e, dict):
            raise BadInput(f"{where} must be a table")
        extra = set(e) - _KEYS
        if extra:
            k = min(extra)
            raise BadInput(f"{where}: unknown key {k!r}{did_you_mean(k, _KEYS)}")
        missing = [k for k in _REQUIRED if k not in e or e[k] in ("", None)]
        if missing:
            raise BadInput(f"{where}: missing {missing[0]!r} (every price needs gpu, usd_per_hour, date, source)")
        rate = e["usd_per_hour"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise BadInput(f"{where}: usd_per_hour must be a positive number, got {rate!r}")
        aliases = e.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise BadInput(f"{where}: aliases must be a list of strings")
        price = Price(
            gpu=str(e["gpu"]), usd_per_hour=float(rate), date=str(e["date"]), source=str(e["source"]),
            aliases=tuple(aliases), provider=str(e.get("provider", "")), instance=str(e.get("instance", "")),
            note=str(e.get("note", "")),
        )
        for name in (price.gpu, *price.aliases):
            key = _norm(name)
            if key in seen:
                raise BadInput(f"{where}: GPU name {name!r} is already priced by {seen[key]!r}")
            seen[key] = price.gpu
        out.append(price)
    return PriceTable(prices=tuple(out), path=str(p))


def price_for(gpu: str, prices: PriceTable) -> Price:
    """The price of ``gpu``: matched by name/alias, else through the GPU catalog's name and aliases."""
    index = {_norm(n): p for p in prices.prices for n in (p.gpu, *p.aliases)}
    hit = index.get(_norm(gpu))
    if hit is not None:
        return hit
    try:
        from quantrack.hardware.catalog import get_gpu

        entry = get_gpu(gpu)
    except NotFound:
        entry = None
    if entry is not None:
        for name in (entry.name, *entry.aliases):
            hit = index.get(_norm(name))
            if hit is not None:
                return hit
    raise NotFound(f"no price for GPU {gpu!r} in {prices.path}{did_you_mean(gpu, prices.names())}; "
                   f"priced: {', '.join(prices.names())} (add it with --prices FILE)")


def cost_per_million_tokens(gpu: str, output_tps: float | None, prices: PriceTable, *, gpu_count: int = 1) -> float:
    """Derived: US$ per 1M output tokens = price/h x GPUs / (measured output tok/s x 3600) x 1e6.

    ``output_tps`` is a *measured* aggregate output throughput (tokens/s across all concurrent
    requests) at one concurrency; the caller labels which.
    """
    if output_tps is None or isinstance(output_tps, bool) or not math.isfinite(float(output_tps)) or output_tps <= 0:
        raise BadInput(f"cannot price GPU {gpu!r}: no measured output throughput (got {output_tps!r})")
    if gpu_count < 1:
        raise BadInput(f"gpu_count must be >= 1, got {gpu_count}")
    price = price_for(gpu, prices)
    return price.usd_per_hour * gpu_count / (float(output_tps) * 3600.0) * 1e6


def cost_column(concurrency: int) -> str:
    """The compare table's column header for cost at one measured concurrency."""
    return f"$ / 1M out tok (derived, @c{int(concurrency)})"


def cost_cell(
    gpu: str | None,
    throughput_by_concurrency: Mapping[int, float | None] | None,
    concurrency: int,
    prices: PriceTable,
    *,
    gpu_count: int = 1,
) -> str:
    """One compare-table cell: the derived cost at ``concurrency``, or '—' where nothing was measured.

    ``throughput_by_concurrency`` maps a concurrency level to the *measured* output tok/s there
    (a sweep's levels). No interpolation between levels: an unmeasured level is not priced.
    An unknown GPU or one without a price is '—' too (the table stays printable); use
    ``cost_per_million_tokens`` to get the error.
    """
    if not gpu or not throughput_by_concurrency:
        return NOT_PRICED
    tps = throughput_by_concurrency.get(int(concurrency))
    if tps is None or tps <= 0:
        return NOT_PRICED
    try:
        value = cost_per_million_tokens(gpu, tps, prices, gpu_count=gpu_count)
    except NotFound:
        return NOT_PRICED
    return f"{value:.3f}" if value < 10 else f"{value:.2f}"


def price_summary(gpu: str, prices: PriceTable) -> dict[str, Any]:
    """What to print or log beside a cost: the rate, its date and its source."""
    p = price_for(gpu, prices)
    return {"gpu": p.gpu, "usd_per_hour": p.usd_per_hour, "date": p.date, "source": p.source,
            "provider": p.provider, "instance": p.instance, "note": p.note}


__all__ = [
    "NOT_PRICED",
    "Price",
    "PriceTable",
    "cost_cell",
    "cost_column",
    "cost_per_million_tokens",
    "load_prices",
    "price_for",
    "price_summary",
]
