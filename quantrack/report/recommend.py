"""The recommendation of one GPU section: the Pareto frontier of (throughput at the SLO, accuracy), the arm to
deploy and what would change the answer."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quantrack.constraints import (
    Constraints,
)
from quantrack.report.judge import (
    GSM8K_SIZE,
    V_CLEAR,
    ArmDecision,
)
from quantrack.report.labelled import Figure
from quantrack.run.schema import (
    RunStatus,
)


@dataclass
class Section:
    gpu: str
    baseline: str | None
    arms: list[ArmDecision]
    frontier: list[str] = field(default_factory=list)
    frontier_axes: str = ""
    frontier_note: str = ""
    recommended: str | None = None
    recommendation: str = ""
    changes: list[str] = field(default_factory=list)
    probe: dict[int, Figure] = field(default_factory=dict)  # FP8 GEMM speedup per batch (node facts)
    probe_run: str | None = None



def pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """Names not dominated on (x higher better, y higher better)."""
    out = []
    for n, (x, y) in points.items():
        if not any((x2 >= x and y2 >= y and (x2 > x or y2 > y)) for m, (x2, y2) in points.items() if m != n):
            out.append(n)
    return sorted(out, key=lambda n: -points[n][0])


def recommend(sec: Section, c: Constraints) -> None:
    arms = {a.arm: a for a in sec.arms}
    what = "throughput at the SLO" if c.slos else "throughput at the highest measured concurrency"
    xs = {a.arm: a.throughput.value for a in sec.arms if a.throughput.value is not None
          and a.status == RunStatus.FINISHED}
    accs = {n: arms[n].acc.accuracy.value for n in xs if arms[n].acc.accuracy.value is not None}
    if len(accs) >= 2:
        pts = {n: (xs[n], v) for n, v in accs.items() if v is not None}
        sec.frontier_axes = f"({what}, GSM8K accuracy)"
    else:
        kls = {n: (0.0 if arms[n].baseline and arms[n].kl.value is None else arms[n].kl.value) for n in xs}
        pts = {n: (xs[n], -v) for n, v in kls.items() if v is not None}
        sec.frontier_axes = f"({what}, −KL vs the baseline; the baseline's own KL is 0 by definition unless measured)"
        sec.frontier_note = "GSM8K was measured for fewer than two arms, so the accuracy axis is the KL fidelity."
    if len(pts) >= 2:
        sec.frontier = pareto(pts)
    else:
        sec.frontier_note = (f"Not computed: {len(pts)} arm(s) have both a throughput and an accuracy figure "
                             "(GSM8K or KL); a frontier needs two.")
    left = sorted(set(arms) - set(pts))
    if left:
        sec.frontier_note += (" " if sec.frontier_note else "") + \
            f"Not placed (a figure missing): {', '.join(left)}."
    cleared = [a for a in sec.arms if a.verdict == V_CLEAR and a.throughput.value is not None]
    priced = all(a.cost.value is not None for a in cleared)
    if cleared:
        if priced:
            best = min(cleared, key=lambda a: (a.cost.value or math.inf, a.arm))
            why = f"the lowest cost per 1M output tokens at the SLO ({best.cost.show()}, {best.cost.kind})"
        else:
            best = max(cleared, key=lambda a: (a.throughput.value or 0.0, a.arm))
            why = f"the highest {what}"
        sec.recommended = best.arm
        lvl = f" at c{best.slo_level}" if best.slo_level is not None else ""
        lead = (f"the only arm that clears every constraint ({best.throughput.show()}{lvl}" if len(cleared) == 1 else
                f"of the {len(cleared)} arms that clear every constraint it has {why}: {best.throughput.show()}{lvl}")
        sec.recommendation = (f"Deploy {best.arm}: {lead}"
                              + (f", {best.throughput_x.show()} the baseline" if best.throughput_x.known
                                 and not best.baseline else "")
                              + (f", capacity {best.capacity_x.show()}" if best.capacity_x.known
                                 and not best.baseline else "") + (")." if len(cleared) == 1 else "."))
    else:
        sec.recommendation = "No arm clears every constraint: nothing can be recommended for deployment yet."
    sec.changes = _what_would_change(sec, c, cleared)


def _blockers(a: ArmDecision, c: Constraints, gain: str) -> list[str]:
    """Everything that keeps ``a`` from being cleared, each with what would lift it."""
    out: list[str] = []
    for k in a.slo_checks:
        if k.status == "unknown":
            out.append(f"{a.arm}{gain}: {k.reason}.")
        elif k.status == "misses" and k.value.value is not None:
            out.append(f"{a.arm}{gain}: would meet {k.slo.name} @c{k.slo.concurrency} with a limit of "
                       f"{k.value.value:,.1f} ms instead of {k.slo.limit_ms:g} ms"
                       + (f", or at c{k.goodput_c}" if k.goodput_c else "") + ".")
    if a.baseline:
        return out
    st = a.acc.budget_status
    if c.max_accuracy_drop is not None:
        if st == "crosses":
            need = a.acc.n_needed_budget
            more = ("" if need is None else
                    f"; about {need:,} questions per arm would resolve it" +
                    (" (more than GSM8K's 1,319: not resolvable with GSM8K alone)" if need > GSM8K_SIZE else ""))
            out.append(f"{a.arm}{gain}: {a.acc.budget_reason}{more}.")
        elif not a.acc.accuracy.known:
            out.append(f"{a.arm}{gain}: GSM8K is FILL IN; measure it ([eval] task = \"gsm8k\" or `quantrack "
                       f"eval gsm8k` then `quantrack log`): if Δ's 95% interval stays above "
                       f"−{c.max_accuracy_drop * 100:g} pp, {a.arm} would be cleared on accuracy.")
        elif st == "exceeds":
            out.append(f"{a.arm}: over the accuracy budget ({a.acc.budget_reason}).")
        elif st == "unknown":
            out.append(f"{a.arm}{gain}: {a.acc.budget_reason}.")
    if c.max_kl is not None:
        if a.kl_status == "unknown":
            out.append(f"{a.arm}{gain}: KL not measured ([eval] kl = {{ tokens = 2000 }}).")
        elif a.kl_status == "exceeds":
            out.append(f"{a.arm}: KL {a.kl.show()} over the {c.max_kl:g} budget.")
    if c.max_accuracy_drop is None and c.max_kl is None:
        out.append(f"{a.arm}{gain}: state an accuracy budget (--max-accuracy-drop 1pp or --max-kl 0.01)"
                   + ("" if a.acc.accuracy.known else " and measure GSM8K (FILL IN)") + ".")
    return out


def _what_would_change(sec: Section, c: Constraints, cleared: list[ArmDecision]) -> list[str]:
    out: list[str] = []
    best = next((a for a in sec.arms if a.arm == sec.recommended), None)
    for a in sorted(sec.arms, key=lambda a: -(a.throughput.value or 0.0)):
        if a is best or a.status != RunStatus.FINISHED:
            continue
        faster = best is None or (a.throughput.value or 0.0) > (best.throughput.value or 0.0)
        if not faster:
            continue
        gain = (f" ({a.throughput.value / best.throughput.value:.2f}× {best.arm}'s throughput)"
                if best is not None and a.throughput.value and best.throughput.value else "")
        out += _blockers(a, c, gain)
    if best is not None and not best.baseline and best.acc.delta_ci is not None and c.max_accuracy_drop is not None:
        lo = best.acc.delta_ci[0]
        out.append(f"{best.arm} stays cleared while the accuracy budget is at least {-lo * 100:.1f} pp (the lower end "
                   "of its Δ interval); a tighter budget would rule it out.")
    if best is not None:
        for k in best.slo_checks:
            if k.value.value is not None:
                out.append(f"{best.arm} meets {k.slo.name} @c{k.slo.concurrency} with {k.value.value:,.1f} ms: a limit "
                           f"below that would rule it out.")
    if not out and best is not None:
        out.append("Nothing measured here would change it: every faster arm is ruled out by a measured figure.")
    return out
