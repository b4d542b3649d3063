"""Open-loop arrivals, per-request SLOs and goodput, repeat intervals and the SLO-limit search (pure).

* :func:`arrival_offsets`: when each request of a rate level is sent, from the level's start: ``poisson``
  (exponential gaps, mean 1/rate, as ``vllm bench serve --request-rate R`` with burstiness 1) or ``constant``
  (1/rate apart); seeded, so two runs with the same seed send on the same schedule.
* :class:`RequestSlo` (``ttft:500,tpot:50,e2el:10000`` in ms: the grammar of ``vllm bench serve --goodput``)
  and :func:`goodput`: the requests meeting every stated limit, per second of the level's wall time.
* :func:`repeat_stats`: mean and 95% Student-t interval of a figure over ``--repeats`` runs of a level.
* :class:`LevelCriterion` and :func:`next_search_level`: bisection over *measured* levels for the highest
  concurrency or rate whose level statistics meet an SLO; the answer is always a level that was measured.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quantrack.errors import BadInput, did_you_mean

ARRIVALS = ("poisson", "constant")
SLO_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms", "e2e": "e2e_ms"}
LEVEL_METRICS = ("ttft", "tpot", "e2e")
LEVEL_STATS = ("p50", "p90", "p95", "p99", "mean")


def arrival_offsets(n: int, rate: float, kind: str = "poisson", seed: int = 0) -> list[float]:
    """Send times (seconds from the level's start) of ``n`` requests at ``rate`` requests/s; the first at 0."""
    if kind not in ARRIVALS:
        raise BadInput(f"unknown arrival {kind!r}{did_you_mean(kind, ARRIVALS)}; arrivals: {', '.join(ARRIVALS)}")
    if not (math.isfinite(rate) and rate > 0):
        raise BadInput(f"--rate must be a finite number of requests/s > 0 (got {rate!r})")
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        out.append(t)
        if i < n - 1:
            t += rng.expovariate(rate) if kind == "poisson" else 1.0 / rate
    return out


def achieved_rate(sent_at: Sequence[float]) -> float | None:
    """Requests/s actually dispatched: (n - 1) / (last send - first send); None below two requests."""
    if len(sent_at) < 2:
        return None
    span = max(sent_at) - min(sent_at)
    return (len(sent_at) - 1) / span if span > 0 else None


@dataclass(frozen=True)
class RequestSlo:
    """Per-request limits in ms (None = not stated): a request is *good* when it meets every stated one."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms))
                if v is not None}

    def text(self) -> str:
        return ",".join(f"{k.removesuffix('_ms')}:{v:g}" for k, v in self.to_dict().items())

    def met(self, ttft_ms: float | None, tpot_ms: float | None, e2e_ms: float | None) -> bool:
        for limit, v in ((self.ttft_ms, ttft_ms), (self.tpot_ms, tpot_ms), (self.e2e_ms, e2e_ms)):
            if limit is not None and (v is None or v > limit):
                return False
        return True


def parse_request_slo(text: str, where: str = "--goodput") -> RequestSlo:
    """``ttft:500,tpot:50,e2el:10000`` (ms; spaces or commas between, as ``vllm bench serve --goodput``)."""
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"{where}: give per-request limits in ms, e.g. 'ttft:500,tpot:50'")
    if len(text) > 200:
        raise BadInput(f"{where}: at most 200 characters (got {len(text)})")
    vals: dict[str, float] = {}
    for part in text.replace(",", " ").split():
        key, sep, value = part.partition(":")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise BadInput(f"{where} {part!r}: expected KEY:MS with KEY one of ttft, tpot, e2el"
                           f"{did_you_mean(key, tuple(SLO_KEYS)) if key else ''}")
        try:
            v = float(value) if len(value) <= 20 else math.nan
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise BadInput(f"{where} {part!r}: the limit must be a positive number of ms")
        if SLO_KEYS[key] in vals:
            raise BadInput(f"{where} {part!r}: {key} is given twice (one limit per metric)")
        vals[SLO_KEYS[key]] = v
    return RequestSlo(**vals)


def goodput(per_request: Iterable[tuple[float | None, float | None, float | None, int]], slo: RequestSlo,
            wall_s: float, n_sent: int) -> dict[str, Any]:
    """Goodput of a level: ``per_request`` = (ttft_ms, tpot_ms, e2e_ms, output tokens) of each ok request.

    request_s = good requests / wall; output_tok_s = their output tokens / wall; fraction = good / sent
    (a failed request is never good)."""
    good = [r for r in per_request if slo.met(r[0], r[1], r[2])]
    ok = wall_s > 0
    return {
        "slo": slo.to_dict(),
        "n_good": len(good),
        "fraction": len(good) / n_sent if n_sent else None,
        "request_s": len(good) / wall_s if ok else None,
        "output_tok_s": sum(r[3] for r in good) / wall_s if ok else None,
    }


def repeat_stats(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Mean and 95% t-interval over repeats (None values = a repeat without the figure: n says how many had it)."""
    from quantrack.measure.stats import summarize

    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    sm = summarize(vals)
    if sm is None:
        return None
    return {"mean": sm.mean, "ci95_low": sm.ci95_low, "ci95_high": sm.ci95_high, "std": sm.std, "n": sm.n,
            "values": vals}


def within_noise(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """Do two repeat intervals overlap (the difference lies within run-to-run noise)? None without intervals."""
    if not a or not b or a.get("ci95_low") is None or b.get("ci95_low") is None:
        return None
    return bool(a["ci95_low"] <= b["ci95_high"] and b["ci95_low"] <= a["ci95_high"])


@dataclass(frozen=True)
class LevelCriterion:
    """A level-statistic limit for the SLO search: ``tpot_p95<=50ms`` (metric ttft|tpot|e2e, stat p50..p99|mean)."""

    metric: str
    stat: str
    limit_ms: float
    text: str

    def value(self, row: Mapping[str, Any]) -> float | None:
        d = row.get(f"{self.metric}_ms")
        v = d.get(self.stat) if isinstance(d, Mapping) else None
        return float(v) if isinstance(v, (int, float)) else None

    def met(self, row: Mapping[str, Any]) -> bool | None:
        v = self.value(row)
        return None if v is None else v <= self.limit_ms


def parse_criterion(text: str, where: str = "--slo-search") -> LevelCriterion:
    """``tpot_p95<=50ms`` / ``ttft_p99<=2s`` (no regular expression: linear in the input)."""
    if not isinstance(text, str) or len(text) > 100 or "<=" not in text:
        raise BadInput(f"{where} {text!r}: expected METRIC_STAT<=VALUE(ms|s), e.g. 'tpot_p95<=50ms'")
    name, _, limit = (p.strip() for p in text.partition("<="))
    names = tuple(f"{m}_{s}" for m in LEVEL_METRICS for s in LEVEL_STATS)
    if name.lower() not in names:
        raise BadInput(f"{where} {text!r}: unknown metric {name!r}{did_you_mean(name.lower(), names)}; "
                       f"known: {', '.join(LEVEL_METRICS)} x {', '.join(LEVEL_STATS)}")
    unit = "ms" if limit.lower().endswith("ms") else ("s" if limit.lower().endswith("s") else "")
    try:
        v = float(limit[: len(limit) - len(unit)]) if unit else math.nan
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise BadInput(f"{where} {text!r}: the limit must be a positive number with a unit, ms or s")
    metric, stat = name.lower().split("_", 1)
    return LevelCriterion(metric, stat, v * (1000.0 if unit == "s" else 1.0), text.strip())


def next_search_level(verdicts: Mapping[float, bool], *, integer: bool, resolution: float = 0.1) -> float | None:
    """The next level to measure when bisecting for the highest level that meets: between the highest level
    meeting below the lowest miss (0 if none) and that miss; None when they are adjacent (integer levels) or
    within ``resolution`` (relative, rates), or when no level misses (nothing above to bound the search)."""
    misses = sorted(x for x, ok in verdicts.items() if not ok)
    if not misses:
        return None
    hi = misses[0]
    lo = max((x for x, ok in verdicts.items() if ok and x < hi), default=0.0)
    if integer:
        mid = float(math.floor((lo + hi) / 2))
        return None if hi - lo <= 1 or mid <= lo or mid < 1 else mid
    if (hi - lo) / hi <= resolution:
        return None
    return round((lo + hi) / 2, 6)


def search_result(criterion: LevelCriterion, verdicts: Mapping[float, bool], values: Mapping[float, float | None],
                  mode: str) -> dict[str, Any]:
    """What the search found: the highest *measured* level meeting the criterion below the first miss."""
    misses = sorted(x for x, ok in verdicts.items() if not ok)
    hi = misses[0] if misses else None
    ok_levels = [x for x, ok in verdicts.items() if ok and (hi is None or x < hi)]
    lo = max(ok_levels) if ok_levels else None
    return {
        "criterion": criterion.text, "mode": mode,
        "limit": _level_value(lo, mode), "first_miss": _level_value(hi, mode),
        "bounded": hi is not None,
        "levels": [{"level": _level_value(x, mode), "meets": verdicts[x], "value_ms": values.get(x)}
                   for x in sorted(verdicts)],
        "note": ("highest measured level meeting the criterion (never interpolated)" if hi is not None else
                 "every measured level meets it: the limit is at least the highest level measured"),
    }


def _level_value(x: float | None, mode: str) -> float | int | None:
    if x is None:
        return None
    return int(x) if mode == "concurrency" else x
