"""The constraints an arm is judged by (``quantrack report``): latency SLOs per concurrency, an accuracy budget, a KL
budget and a prices file — their grammar and the checks of a study file's ``[decision]`` table.

``tpot_p99<=30ms@64`` is ``METRIC_STAT <= VALUE ms|s @ CONCURRENCY``, METRIC and STAT being what the sweep records per
level (``quantrack.measure.sweep.level_row``: ttft / tpot / e2e, each p50 / p90 / p99 / mean); ``1pp`` is an accuracy
drop in percentage points; ``0.01`` a mean KL in nats per token.

Below the study schema (``quantrack.study`` checks ``[decision]`` with it before anything starts) and below the
report (``quantrack.report.decision`` judges by it): it imports neither.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput, did_you_mean

SLO_METRICS = ("ttft", "tpot", "e2e")
SLO_STATS = ("p50", "p90", "p95", "p99", "mean")  # what the sweep records per level (measure/sweep.py level_row)
SLO_NAMES = tuple(f"{m}_{s}" for m in SLO_METRICS for s in SLO_STATS)
# Linear-time on any input: every number has one way to match ([0-9]+(.[0-9]*)? or .[0-9]+, never [0-9]*.?[0-9]+,
# which backtracks quadratically on a long digit string), ASCII only (`@٤` is not 4), and inputs are length-capped
# before matching (bench/linear_inputs.py, docs/benchmarks.md).
_NUM = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_SLO_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|≤)\s*(" + _NUM + r"(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*@\s*[cC]?([0-9]+)\s*$",
                     re.ASCII)
_PP_RE = re.compile(r"^\s*(" + _NUM + r")\s*(pp|pts?|points?)\s*$", re.IGNORECASE | re.ASCII)
MAX_CONSTRAINT_CHARS = 200  # the longest SLO or budget string read; a longer one is refused, not parsed


def _capped(text: str, where: str) -> str:
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise BadInput(f"{where}: {len(text)} characters ({text[:24]!r}…); an SLO or budget is at most "
                       f"{MAX_CONSTRAINT_CHARS} characters, e.g. 'tpot_p99<=30ms@64'")
    return text
DECISION_KEYS = ("slo", "max_accuracy_drop", "max_kl", "prices")


@dataclass(frozen=True)
class Slo:
    """One latency objective: ``metric_stat <= limit_ms`` while serving ``concurrency`` requests at once."""

    metric: str  # ttft | tpot | e2e
    stat: str  # p50 | p90 | p99 | mean
    limit_ms: float
    concurrency: int
    text: str = ""

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.stat}"

    def label(self) -> str:
        return f"{self.metric.upper()} {self.stat} ≤ {self.limit_ms:g} ms @ c{self.concurrency}"


def parse_slo(text: str, where: str = "--slo") -> Slo:
    """``tpot_p99<=30ms@64`` -> Slo; a bad string or an unrecorded metric is a one-line BadInput."""
    if not isinstance(text, str):
        raise BadInput(f"{where} {text!r}: an SLO is a string like 'tpot_p99<=30ms@64'")
    m = _SLO_RE.match(_capped(text, where))
    if not m:
        raise BadInput(f"{where} {text!r}: expected METRIC<=VALUE(ms|s)@CONCURRENCY, e.g. 'tpot_p99<=30ms@64'")
    name, _, value, unit, conc = m.groups()
    name = name.lower()
    if name not in SLO_NAMES:
        raise BadInput(f"{where} {text!r}: unknown metric {name!r}{did_you_mean(name, SLO_NAMES)}; the sweep records "
                       f"{', '.join(SLO_METRICS)} as {', '.join(SLO_STATS)} per concurrency level")
    unit = unit.lower()
    if unit not in ("ms", "s"):
        raise BadInput(f"{where} {text!r}: the limit needs a unit, ms or s (got {unit or 'none'!r})")
    limit = float(value) * (1000.0 if unit == "s" else 1.0)
    c = int(conc)
    if not math.isfinite(limit) or limit <= 0:
        raise BadInput(f"{where} {text!r}: the limit must be a positive number")
    if c < 1:
        raise BadInput(f"{where} {text!r}: the concurrency must be >= 1")
    metric, stat = name.split("_", 1)
    return Slo(metric=metric, stat=stat, limit_ms=limit, concurrency=c, text=text.strip())


def parse_accuracy_drop(text: Any, where: str = "--max-accuracy-drop") -> float:
    """``1pp`` -> 0.01 (a fraction of questions); percentage points only, so '1%' is not read as relative."""
    m = _PP_RE.match(_capped(text, where)) if isinstance(text, str) else None
    if not m:
        raise BadInput(f"{where} {text!r}: give the budget in percentage points, e.g. '1pp' or '0.5pp'")
    pp = float(m.group(1))
    if not 0 < pp < 100:
        raise BadInput(f"{where} {text!r}: the budget must be between 0 and 100 pp")
    return pp / 100.0


def parse_max_kl(value: Any, where: str = "--max-kl", *, from_text: bool = False) -> float:
    """A positive number of nats per token. A study file gives a TOML number (``max_kl = "0.01"``, a string, is
    refused); the command line's ``--max-kl`` text is read with ``from_text=True``."""
    if isinstance(value, str) and not from_text:
        raise BadInput(f"{where} {value!r}: a number, not a string (write max_kl = {value.strip()})"
                       if len(value) < 40 else f"{where}: a number, not a string")
    if isinstance(value, str):
        _capped(value, where)
    try:
        v = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or v <= 0:
        raise BadInput(f"{where} {value!r}: a positive number of nats per token, e.g. 0.01")
    return v


@dataclass(frozen=True)
class Constraints:
    slos: tuple[Slo, ...] = ()
    max_accuracy_drop: float | None = None  # fraction (0.01 = 1 pp)
    max_kl: float | None = None
    prices: str | None = None  # a prices TOML, else the shipped rules/prices.toml
    sources: tuple[str, ...] = ()  # where they came from: 'flags', 'study file X', 'parent run R'

    def describe(self) -> list[str]:
        out = [f"SLO {s.label()}" for s in self.slos] or ["no latency SLO stated (--slo)"]
        if self.max_accuracy_drop is not None:
            out.append(f"GSM8K accuracy drop ≤ {self.max_accuracy_drop * 100:g} pp vs the baseline, judged on the "
                       "95% interval of Δ")
        if self.max_kl is not None:
            out.append(f"mean KL(baseline ‖ arm) ≤ {self.max_kl:g} nats/token")
        if self.max_accuracy_drop is None and self.max_kl is None:
            out.append("no accuracy budget stated (--max-accuracy-drop / --max-kl): no candidate arm can be cleared")
        return out


def constraints_from_table(table: Any, where: str, base_dir: Path | None = None) -> Constraints:
    """The study file's ``[decision]`` table -> Constraints (every key checked; one-line errors). ``where`` prefixes
    the messages ("" when the caller adds the file's name itself)."""
    sources = (where,) if where else ()
    where = f"{where}: [decision]" if where else "[decision]"
    if not isinstance(table, dict):
        raise BadInput(f"{where} must be a table")
    extra = set(table) - set(DECISION_KEYS)
    if extra:
        k = min(extra)
        raise BadInput(f"{where} unknown key {k!r}{did_you_mean(k, DECISION_KEYS)}; "
                       f"keys: {', '.join(DECISION_KEYS)}")
    slo = table.get("slo", [])
    if isinstance(slo, str):
        slo = [slo]
    if not isinstance(slo, list):
        raise BadInput(f"{where} slo must be a list of strings like 'tpot_p99<=30ms@64'")
    slos = tuple(parse_slo(s, f"{where} slo") for s in slo)
    drop = table.get("max_accuracy_drop")
    kl = table.get("max_kl")
    prices = table.get("prices")
    if prices is not None and not isinstance(prices, str):
        raise BadInput(f"{where} prices must be a path to a prices TOML")
    if prices and base_dir is not None and not Path(prices).is_absolute():
        prices = str(base_dir / prices)
    return Constraints(
        slos=slos,
        max_accuracy_drop=None if drop is None else parse_accuracy_drop(drop, f"{where} max_accuracy_drop"),
        max_kl=None if kl is None else parse_max_kl(kl, f"{where} max_kl"),
        prices=prices or None, sources=sources)


def merge_constraints(flags: Constraints, base: Constraints | None) -> Constraints:
    """Flags override the study file key by key (given --slo flags replace the study's list)."""
    if base is None:
        return flags
    used_base = (not flags.slos and bool(base.slos)) or (flags.max_accuracy_drop is None and
                                                        base.max_accuracy_drop is not None) or \
        (flags.max_kl is None and base.max_kl is not None) or (flags.prices is None and base.prices is not None)
    return Constraints(
        slos=flags.slos or base.slos,
        max_accuracy_drop=flags.max_accuracy_drop if flags.max_accuracy_drop is not None else base.max_accuracy_drop,
        max_kl=flags.max_kl if flags.max_kl is not None else base.max_kl,
        prices=flags.prices or base.prices,
        sources=tuple(dict.fromkeys(flags.sources + (base.sources if used_base else ()))))


__all__ = ["DECISION_KEYS", "SLO_METRICS", "SLO_NAMES", "SLO_STATS", "Constraints", "Slo", "constraints_from_table",
           "merge_constraints", "parse_accuracy_drop", "parse_max_kl", "parse_slo"]
