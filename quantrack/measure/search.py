"""The SLO search that measures (pure): probe new request rates (or concurrency levels) for the highest one meeting
a level criterion (``ttft_p95<=1s``), each probe repeated, the answer always a bracket.

The search (:func:`probe_search`) has two phases, both of measured probes:

1. **ascent**: probe the range's low end, then double (capped at the high end) until a probe misses, a probe is
   over-saturated, or the high end meets. Low end misses: stop, *never met* (the limit is below the range). High end
   meets: stop, *top of range* (the limit is at least the high end).
2. **bisection** between the highest level that met and the lowest that missed, at their geometric midpoint
   (rates rounded to 3 significant digits when that stays strictly inside), until
   ``(missed - met) / missed <= tolerance`` (concurrency: also when the two are adjacent integers).

A probe is measured ``repeats`` times; its verdict is the criterion on the pooled requests of its repeats, and
its spread (each repeat's value) is shown beside it. **Over-saturation** (rate probes; :func:`saturation`): the
server cannot keep up with the offered rate, so the probe counts as a miss whatever its latencies say, and the
ascent stops there (no higher rate is offered). Two rules, each stated in the result:

* *dispatch*: the median request went out later than its schedule by more than the mean gap between arrivals
  (1 / offered rate): requests queue in the client behind ``--max-concurrency``. (Not the achieved send rate
  against the offered one: over a few Poisson arrivals that ratio is noise, 0.77 at 1/s with 4 requests on the
  llama.cpp test server, nothing queued);
* *completion*: requests finish at below ``(1 - margin)`` x the rate they were sent (requests queue in the
  server: completion rate = (ok requests - 1) / (last finish - first finish)).

The number of probes is bounded before the first is sent (:func:`probe_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.measure.load import LevelCriterion

SEARCH_MODES = ("measured", "rate", "concurrency")  # measured = bisect between measured levels (the default)
SATURATION_MARGIN = 0.2  # a rate below 80% of the one it should match is "clearly below"
MAX_SEARCH_REPEATS = 10


@dataclass(frozen=True)
class ProbeSpec:
    """How the probing search runs: ``mode`` rate (requests/s) or concurrency, over [low, high]."""

    mode: str
    low: float
    high: float
    tolerance: float = 0.1
    repeats: int = 2
    margin: float = SATURATION_MARGIN

    @property
    def integer(self) -> bool:
        return self.mode == "concurrency"

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "range": [_num(self.low, self.integer), _num(self.high, self.integer)],
                "tolerance": self.tolerance, "repeats": self.repeats, "saturation_margin": self.margin}


def parse_search_range(text: str, mode: str, where: str = "--search-range") -> tuple[float, float]:
    """``LOW:HIGH`` (rate: requests/s > 0; concurrency: integers >= 1), LOW < HIGH."""
    if not isinstance(text, str) or len(text) > 50 or text.count(":") != 1:
        raise BadInput(f"{where} {text!r}: expected LOW:HIGH, e.g. 0.5:64")
    parts = text.split(":")
    try:
        lo, hi = (float(p) if len(p.strip()) <= 20 else math.nan for p in parts)
    except ValueError:
        lo = hi = math.nan
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo < hi < 1e6):
        raise BadInput(f"{where} {text!r}: LOW and HIGH must be numbers with 0 < LOW < HIGH < 1e6")
    if mode == "concurrency" and (lo != int(lo) or hi != int(hi) or hi > 4096):
        raise BadInput(f"{where} {text!r}: concurrency levels are whole numbers from 1 to 4096")
    if mode == "rate" and lo < 0.001:
        raise BadInput(f"{where} {text!r}: the lowest rate is 0.001 requests/s (slower outlasts every timeout)")
    return lo, hi


def probe_spec(mode: str, search_range: str | None, tolerance: float, repeats: int, *, criterion: object,
               prefix: str = "--") -> ProbeSpec | None:
    """The validated probe settings, or None for ``measured`` (then no probe key may be given).
    ``prefix``: ``--`` for flags (``--search-range``), ``[sweep] `` for a study's keys (``search_range``)."""
    def name(key: str) -> str:
        return f"--{key.replace('_', '-')}" if prefix == "--" else f"{prefix}{key}"

    if mode not in SEARCH_MODES:
        raise BadInput(f"{name('search_mode')} {mode!r}: one of {', '.join(SEARCH_MODES)}"
                       f"{did_you_mean(str(mode), SEARCH_MODES)}")
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and 0.001 <= tolerance <= 0.99):
        raise BadInput(f"{name('search_tolerance')} must be a relative width from 0.001 to 0.99 (got {tolerance!r})")
    if not (isinstance(repeats, int) and 1 <= repeats <= MAX_SEARCH_REPEATS):
        raise BadInput(f"{name('search_repeats')} must be from 1 to {MAX_SEARCH_REPEATS} (got {repeats!r})")
    if mode == "measured":
        if search_range is not None:
            raise BadInput(f"{name('search_range')} applies to {name('search_mode')} rate or concurrency (the "
                           "measured mode bisects between the levels given)")
        return None
    if criterion is None:
        raise BadInput(f"{name('search_mode')} {mode} needs {name('slo_search')} CRITERION, e.g. "
                       "'ttft_p95<=1000ms'")
    if search_range is None:
        raise BadInput(f"{name('search_mode')} {mode} needs {name('search_range')} LOW:HIGH, e.g. 0.5:64")
    lo, hi = parse_search_range(search_range, mode, name("search_range"))
    return ProbeSpec(mode, lo, hi, float(tolerance), repeats)


@dataclass
class ProbeOutcome:
    """One probe, measured: the criterion's value on its pooled requests, each repeat's, the verdict."""

    level: float
    value_ms: float | None
    values_ms: list[float | None]
    meets: bool
    saturated: str | None = None  # the rule that fired, with its figures
    why: str | None = None  # a miss without a value: why

    def to_dict(self, integer: bool) -> dict[str, Any]:
        vals = [v for v in self.values_ms if v is not None]
        spread = [min(vals), max(vals)] if vals else None
        split = len(self.values_ms) > 1 and self._split
        return {"level": _num(self.level, integer), "value_ms": self.value_ms, "repeats_ms": self.values_ms,
                "spread_ms": spread, "meets": self.meets, "saturated": self.saturated, "why": self.why,
                "repeats_disagree": split}

    _split: bool = False


def completion_rate(finishes: Sequence[float]) -> float | None:
    """Requests/s finished: (n - 1) / (last finish - first finish); None below two."""
    if len(finishes) < 2:
        return None
    span = max(finishes) - min(finishes)
    return (len(finishes) - 1) / span if span > 0 else None


def saturation(row: Mapping[str, Any], margin: float = SATURATION_MARGIN) -> str | None:
    """Which over-saturation rule a rate level breaks (None: neither, or not a rate level). Over repeats the
    rule is checked on each repeat's figures (``runs``) and fires when it fires in any."""
    if row.get("mode") != "rate":
        return None
    offered = row.get("rate")
    for run in row.get("runs") or [row]:
        sent, done = run.get("achieved_rate"), run.get("completion_rate")
        lag = (run.get("dispatch_lag_ms") or {}).get("p50")
        gap_ms = 1000.0 / offered if isinstance(offered, (int, float)) and offered > 0 else None
        if isinstance(lag, (int, float)) and gap_ms is not None and lag > gap_ms:
            return (f"dispatch: the median request went out {lag:.0f} ms behind its schedule, more than the mean "
                    f"gap {gap_ms:.0f} ms between arrivals at {offered:g}/s (requests queued in the client)")
        if isinstance(sent, (int, float)) and isinstance(done, (int, float)) and done < (1 - margin) * sent:
            return (f"completion: finished {done:.3g}/s < {1 - margin:.0%} of the {sent:.3g}/s sent (requests "
                    "queued in the server)")
    return None


def outcome_from_row(criterion: LevelCriterion, row: Mapping[str, Any], level: float,
                     margin: float = SATURATION_MARGIN) -> ProbeOutcome:
    """A measured sweep row (one repeat, or repeats merged with ``runs``) as a probe outcome."""
    value = criterion.value(row)
    runs = row.get("runs") or [row]
    values = [criterion.value(r) for r in runs]
    sat = saturation(row, margin)
    why = None
    if value is None:
        why = f"no {criterion.metric} figure (no request succeeded)" if not row.get("n_ok") else \
            f"no {criterion.metric} figure"
    meets = value is not None and value <= criterion.limit_ms and sat is None
    per = [v is not None and v <= criterion.limit_ms for v in values]
    out = ProbeOutcome(level, value, values, meets, sat, why)
    out._split = len(set(per)) > 1
    return out


def probe_bound(spec: ProbeSpec) -> int:
    """The most probes :func:`probe_search` sends: the ascent's doublings from low to high plus the bisection's
    halvings (in log space) of a factor-2 bracket down to the tolerance."""
    ascent = 1 + math.ceil(math.log2(spec.high / spec.low) - 1e-9)
    width = -math.log(1 - spec.tolerance)  # bracket done when log(missed / met) <= width
    bisect = max(0, math.ceil(math.log2(math.log(2) / width) - 1e-9))
    if spec.integer:
        bisect = min(bisect, max(0, math.ceil(math.log2(max(1.0, spec.high / 2)))))
    return ascent + bisect


def _done(met: float, missed: float, spec: ProbeSpec) -> bool:
    if spec.integer and missed - met <= 1:
        return True
    return (missed - met) / missed <= spec.tolerance


def _midpoint(met: float, missed: float, spec: ProbeSpec) -> float:
    mid = math.sqrt(met * missed)
    if spec.integer:
        mid = float(math.floor(mid))
        return mid if met < mid < missed else float(met + 1)
    for digits in (3, 4, 5, 6):  # a readable level name (r0.595, not r0.594604), still strictly inside
        short = float(f"{mid:.{digits}g}")
        if met < short < missed:
            return short
    return round(mid, 6)


@dataclass
class SearchTrace:
    """What the search did, in order (kept as probes finish, so an interrupt leaves a readable trace)."""

    probes: list[ProbeOutcome] = field(default_factory=list)


def probe_search(criterion: LevelCriterion, spec: ProbeSpec, measure: Callable[[float], ProbeOutcome],
                 trace: SearchTrace | None = None) -> dict[str, Any]:
    """Run the search; ``measure(level)`` measures one probe (all its repeats). Returns the search result: the
    bracket (``met``: highest level that met; ``missed``: lowest that missed above it), why it stopped, and every
    probe with its spread."""
    tr = trace if trace is not None else SearchTrace()
    bound = probe_bound(spec)

    def probe(x: float) -> ProbeOutcome:
        o = measure(x)
        tr.probes.append(o)
        return o

    met: float | None = None
    missed: float | None = None
    ascent_stop = None
    x = float(math.ceil(spec.low)) if spec.integer else spec.low
    while True:
        o = probe(x)
        if not o.meets:
            missed = x
            ascent_stop = (f"over-saturated at {_name(x, spec)} ({o.saturated})" if o.saturated else
                           f"missed at {_name(x, spec)}")
            break
        met = x
        if x >= spec.high:
            ascent_stop = f"met at the top of the range {_name(x, spec)}"
            break
        x = min(spec.high, x * 2)
    if met is None:
        stop, text = "never_met", (f"the lowest level of the range {_name(missed or spec.low, spec)} misses: the "
                                   "limit is below the range")
    elif missed is None:
        stop, text = "top_of_range", (f"the top of the range {_name(met, spec)} meets: the limit is at least that "
                                      "(raise the range's HIGH to bound it)")
    else:
        while not _done(met, missed, spec) and len(tr.probes) < bound:
            mid = _midpoint(met, missed, spec)
            if mid in (met, missed):
                break
            o = probe(mid)
            if o.meets:
                met = mid
            else:
                missed = mid
        if _done(met, missed, spec):
            stop, text = "tolerance", (f"bracket within the tolerance: ({_name(missed, spec)} - {_name(met, spec)})"
                                       f" / {_name(missed, spec)} = {(missed - met) / missed:.3f} <= "
                                       f"{spec.tolerance:g}" + (" (adjacent levels)" if spec.integer and
                                                                missed - met <= 1 else ""))
        else:
            stop, text = "probe_bound", f"the probe bound ({bound}) was reached before the tolerance"
    return _result(criterion, spec, tr, met, missed, stop, text, ascent_stop)


def interrupted_result(criterion: LevelCriterion, spec: ProbeSpec, trace: SearchTrace) -> dict[str, Any]:
    """What an interrupted search had measured: the bracket its finished probes give (highest met below the
    lowest miss), labelled ``interrupted``, not narrowed to the tolerance."""
    misses = [p.level for p in trace.probes if not p.meets]
    missed = min(misses) if misses else None
    mets = [p.level for p in trace.probes if p.meets and (missed is None or p.level < missed)]
    met = max(mets) if mets else None
    text = (f"interrupted after {len(trace.probes)} finished probes: the bracket is what they measured, not "
            "narrowed to the tolerance")
    return _result(criterion, spec, trace, met, missed, "interrupted", text, "interrupted")


def _result(criterion: LevelCriterion, spec: ProbeSpec, tr: SearchTrace, met: float | None, missed: float | None,
            stop: str, text: str, ascent_stop: str | None) -> dict[str, Any]:
    bound = probe_bound(spec)
    saturated = [_name(p.level, spec) for p in tr.probes if p.saturated]
    return {
        "criterion": criterion.text, "method": "probe", "mode": spec.mode, "kind": "search result (measured probes)",
        "met": _num(met, spec.integer), "missed": _num(missed, spec.integer),
        "limit": _num(met, spec.integer), "first_miss": _num(missed, spec.integer),
        "bounded": missed is not None, "stop": stop, "stop_text": text, "ascent_stop": ascent_stop,
        "saturated": saturated, **spec.to_dict(), "probe_bound": bound, "n_probes": len(tr.probes),
        "saturation_rule": ("dispatch: median send lag behind schedule > the mean arrival gap (1/rate), or "
                            f"completion: finish rate < {1 - spec.margin:.0%} of the send rate" if spec.mode == "rate"
                            else
                            "not checked at concurrency levels (closed loop: the client never sends faster than "
                            "the server answers)"),
        "verdict_rule": "the criterion on the pooled requests of a probe's repeats; an over-saturated probe misses",
        "probes": [p.to_dict(spec.integer) for p in tr.probes],
    }


def bracket_text(s: Mapping[str, Any]) -> str:
    """``r4 met, r4.5 missed`` style text of a probe search's answer (never a point without its bracket)."""
    unit = "c" if s.get("mode") == "concurrency" else "r"
    cut = s.get("stop") == "interrupted"
    met = (f"{unit}{s['met']:g}" if s.get("met") is not None else
           "none measured" if cut else f"none (below {unit}{s['range'][0]:g})")
    missed = (f"{unit}{s['missed']:g}" if s.get("missed") is not None else
              "none measured" if cut else f"none up to {unit}{s['range'][1]:g}")
    return f"[{met} met, {missed} missed]"


def _name(x: float, spec: ProbeSpec) -> str:
    return f"c{int(x)}" if spec.integer else f"r{x:g}"


def _num(x: float | None, integer: bool) -> float | int | None:
    if x is None:
        return None
    return int(x) if integer else x
