"""Judging one arm under the constraints: the SLO checks per measured level, accuracy against the budget
(paired or unpaired interval, the n needed), KL, rulebook warnings, fallbacks, contention, cost; its verdict."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from quantrack.constraints import (
    Constraints,
    Slo,
)
from quantrack.report.armrun import (
    Accuracy,
    ArmRun,
    arm_cost,
    paired_test,
)
from quantrack.report.artifacts import read_artifact, sweep_levels_from_artifact
from quantrack.report.compare import configuration
from quantrack.report.labelled import Figure, FigureKind, fill_in, measured
from quantrack.run.schema import (
    HYGIENE_STEPS,
    Artifact,
    ContentionState,
    FallbackState,
    RuleVerdict,
    RunStatus,
)

if TYPE_CHECKING:
    from quantrack.hardware.pricing import PriceTable
    from quantrack.store.records import RunRow


GSM8K_SIZE = 1319  # questions in the GSM8K test split (quantrack/data/gsm8k/test.jsonl)


class Verdict(StrEnum):
    """An arm's verdict under the constraints, worst first."""

    NOT_MEASURED = "not measured"
    MISSES = "misses"
    CANNOT = "cannot be cleared"
    CLEAR = "cleared"


V_NOT_MEASURED, V_MISSES, V_CANNOT, V_CLEAR = Verdict.NOT_MEASURED, Verdict.MISSES, Verdict.CANNOT, Verdict.CLEAR
VERDICT_ORDER = tuple(Verdict)


SloStatus = Literal["meets", "misses", "unknown"]
BudgetStatus = Literal["within", "exceeds", "crosses", "unknown", "reference", "not judged"]
KlStatus = Literal["within", "exceeds", "unknown", "reference", "not judged"]


@dataclass
class SloCheck:
    slo: Slo
    status: SloStatus
    value: Figure  # the metric at the SLO's concurrency
    goodput_c: int | None = None  # highest measured concurrency meeting the limit
    reason: str = ""


@dataclass
class AccuracyJudgement:
    accuracy: Figure
    interval: tuple[float, float] | None  # the arm's 95% Wilson interval
    n: int | None
    delta: Figure
    delta_ci: tuple[float, float] | None
    paired: bool
    method: str
    distinguishable: bool | None  # Δ told apart from 0 at this n
    n_needed: int | None  # questions per arm to tell |Δ| from 0 (80% power, alpha 0.05)
    budget_status: BudgetStatus
    budget_reason: str
    n_needed_budget: int | None = None  # questions per arm to tell Δ from the budget edge


@dataclass
class ArmDecision:
    arm: str
    run_id: str
    status: RunStatus
    baseline: bool
    configuration: str
    engine: str
    capacity: Figure
    predicted: Figure
    capacity_x: Figure
    tpot_b1: Figure
    levels: dict[int, dict[str, Figure]]  # concurrency -> 'throughput', 'tpot_p50', ... (plots, tables)
    slo_checks: list[SloCheck]
    slo_level: int | None  # highest measured concurrency meeting every SLO
    throughput: Figure  # at slo_level (or the highest measured level without SLOs)
    throughput_x: Figure  # vs the baseline at the same level
    cost: Figure
    acc: AccuracyJudgement
    kl: Figure
    top1: Figure
    kl_status: KlStatus
    warnings: list[str]
    fallbacks: list[str]
    contention: list[str] | None  # None: not recorded
    verdict: Verdict = V_CANNOT
    reasons: list[str] = field(default_factory=list)
    rule_messages: dict[str, str] = field(default_factory=dict)  # warning -> the rule's message (preflight artifact)
    skipped: dict[str, int] = field(default_factory=dict)
    kv_scales: str | None = None  # a quantized KV cache: the scales the engine's lines showed, with the line
    kl_method: str | None = None  # teacher-forced | decode-greedy (run param kl_method)
    load: list[str] = field(default_factory=list)  # goodput, SLO search, the engine's view (load_explanation)


def arm_levels(r: ArmRun, uri: str | None, need_artifact: bool) -> tuple[dict[int, dict[str, Figure]], bool]:
    """Per measured concurrency: throughput and the latency statistics (metrics first, the sweep artifact for the
    rest). Returns (levels, artifact_read)."""
    from quantrack.run.schema import sweep_output_tps, sweep_tpot_p50, sweep_ttft_p50

    levels: dict[int, dict[str, Figure]] = {}
    for c, tps in r.output_tps.items():
        levels.setdefault(c, {})["throughput"] = Figure(tps, FigureKind.MEASURED, f"metric {sweep_output_tps(c)}", r.run_id,
                                                       f"{tps:,.0f} tok/s")
    for metric, name in (("tpot", sweep_tpot_p50), ("ttft", sweep_ttft_p50)):
        for c, lv in r.sweep.items():
            v = lv.tpot_p50_ms if metric == "tpot" else lv.ttft_p50_ms
            if v is not None and math.isfinite(v):
                levels.setdefault(c, {})[f"{metric}_p50"] = Figure(v, FigureKind.MEASURED, f"metric {name(c)}", r.run_id,
                                                                   f"{v:,.1f} ms")
    art = False
    if need_artifact:
        stats = sweep_levels_from_artifact(read_artifact(r.row, Artifact.SWEEP_SWEEP, uri))
        art = bool(stats)
        for c, by_metric in stats.items():
            for metric, vals in by_metric.items():
                for stat, v in vals.items():
                    key = f"{metric}_{stat}"
                    levels.setdefault(c, {}).setdefault(key, Figure(
                        v, FigureKind.MEASURED, f"artifact {Artifact.SWEEP_SWEEP} (c{c} {metric}_ms.{stat})", r.run_id,
                        f"{v:,.1f} ms"))
    return levels, art


def check_slo(slo: Slo, levels: dict[int, dict[str, Figure]], run_id: str, artifact_read: bool) -> SloCheck:
    def meets_at(c: int) -> bool | None:
        f = levels.get(c, {}).get(slo.name)
        return None if f is None or f.value is None else f.value <= slo.limit_ms

    ok_levels = [c for c in sorted(levels) if meets_at(c)]
    goodput = max(ok_levels) if ok_levels else None
    at = levels.get(slo.concurrency)
    fig = at.get(slo.name) if at else None
    if at is None:
        measured = ", ".join(f"c{c}" for c in sorted(levels)) or "none"
        return SloCheck(slo, "unknown", fill_in(f"sweep c{slo.concurrency}", run_id, "not measured"), goodput,
                        f"concurrency {slo.concurrency} was not measured (levels: {measured}); add it to "
                        "[sweep] concurrency")
    if fig is None or fig.value is None:
        where = ("its sweep/sweep.json artifact has no such figure" if artifact_read else
                 "the run's metrics hold only p50 TTFT/TPOT and its sweep/sweep.json artifact could not be read")
        return SloCheck(slo, "unknown", fill_in(f"{slo.name} at c{slo.concurrency}", run_id, "not recorded"),
                        goodput, f"{slo.name} at c{slo.concurrency} not recorded ({where})")
    if fig.value <= slo.limit_ms:
        return SloCheck(slo, "meets", fig, goodput,
                        f"{slo.name} {fig.value:,.1f} ms ≤ {slo.limit_ms:g} ms at c{slo.concurrency}")
    below = (f"; meets it up to c{goodput}" if goodput is not None and goodput < slo.concurrency else
             "; no measured level meets it" if goodput is None else "")
    return SloCheck(slo, "misses", fig, goodput,
                    f"{slo.name} {fig.value:,.1f} ms > {slo.limit_ms:g} ms at c{slo.concurrency} "
                    f"(by {fig.value - slo.limit_ms:,.1f} ms){below}")


def slo_level(slos: tuple[Slo, ...], levels: dict[int, dict[str, Figure]]) -> int | None:
    """The highest measured concurrency at which every SLO's limit holds (its figures known); without SLOs, the
    highest level with a measured throughput."""
    ok = []
    for c, figs in levels.items():
        if "throughput" not in figs:
            continue
        if all((f := figs.get(s.name)) is not None and f.value is not None and f.value <= s.limit_ms for s in slos):
            ok.append(c)
    return max(ok) if ok else None


def unpaired_interval(p1: float, l1: float, u1: float, p2: float, l2: float, u2: float) -> tuple[float, float]:
    """95% interval of p1 - p2 for independent runs: Newcombe's hybrid score interval (Newcombe 1998, Statistics in
    Medicine 17:873-890, method 10) from each run's Wilson interval (l, u). The paired form in
    ``quantrack.accuracy.stats.newcombe_paired_ci`` with the correlation set to 0."""
    d = p1 - p2
    return (max(-1.0, d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)),
            min(1.0, d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)))


def questions_needed(p: float | None, diff: float, discordant: float | None = None, delta: float = 0.0) -> int | None:
    """Questions per arm to tell a difference of ``diff`` at 80% power, alpha 0.05 (``quantrack.accuracy.stats``'
    planning multiplier z_0.975 + z_0.80 = 2.80).

    * independent runs (no per-question records): the stats module's min detectable difference
      2.80 x sqrt(2) x SE solved for n, n = 2 x 2.80^2 x q(1-q) / diff^2, q the baseline accuracy (0.5 at 0% /
      100% / unknown);
    * paired runs (``discordant`` = (b + c) / n of this pair, ``delta`` its Δ): the per-question variance of the
      paired difference is (b + c)/n - Δ^2, so n = 2.80^2 x ((b + c)/n - Δ^2) / diff^2 — usually far fewer,
      since the arms agree on most questions (assumes the discordance rate stays what was measured; with no
      discordant question at all there is no rate to plan with, and the independent figure is given)."""
    from quantrack.accuracy.stats import detectable_multiplier

    if diff <= 0 or not math.isfinite(diff):
        return None
    z2 = detectable_multiplier() ** 2
    if discordant is not None and discordant - delta * delta > 0:
        return math.ceil(z2 * (discordant - delta * delta) / diff ** 2)
    q = 0.5 if p is None or p in (0.0, 1.0) else p
    return math.ceil(2.0 * z2 * q * (1 - q) / diff ** 2)


def _wilson_of(a: Accuracy) -> tuple[float, float] | None:
    lo, hi = a.ci_low, a.ci_high
    if lo is not None and hi is not None:
        return lo, hi
    acc, n = a.accuracy, a.n
    if acc is None or not n:
        return None
    from quantrack.accuracy.stats import wilson_interval

    return wilson_interval(round(acc * n), int(n))


def judge_accuracy(r: ArmRun, base: ArmRun | None, is_base: bool, budget: float | None) -> AccuracyJudgement:
    from quantrack.run.schema import Metric

    src = r.accuracy.source or "measured"
    kind = FigureKind.IMPORTED if r.accuracy.imported else FigureKind.MEASURED
    acc_v = r.accuracy.accuracy
    n = int(r.accuracy.n) if r.accuracy.n is not None else None
    interval = _wilson_of(r.accuracy) if acc_v is not None else None
    if acc_v is None:
        acc = fill_in(f"metric {Metric.GSM8K_ACCURACY}", r.run_id)
    else:
        txt = f"{acc_v * 100:.1f}%" + (f" [{interval[0] * 100:.1f}, {interval[1] * 100:.1f}]" if interval else "") + \
            (f" n={n}" if n is not None else "")
        acc = Figure(acc_v, kind, f"metric {Metric.GSM8K_ACCURACY} (95% Wilson interval)" +
                     (f", {src}" if kind == FigureKind.IMPORTED else ""), r.run_id, txt)
    empty = AccuracyJudgement(acc, interval, n, fill_in("Δ vs baseline", r.run_id), None, False, "", None, None,
                              "unknown", "")
    if is_base:
        empty.delta = Figure(0.0, FigureKind.DERIVED, "the reference arm", r.run_id, "— (baseline)")
        empty.budget_status, empty.budget_reason = "reference", "the baseline is the accuracy reference"
        return empty
    base_acc = base.accuracy.accuracy if base is not None else None
    if base is None:
        empty.budget_reason = "no baseline arm: Δ cannot be formed"
        return empty
    if acc_v is None or base_acc is None:
        who = " and ".join(w for w, v in (("this arm", acc_v), (f"the baseline {base.arm}", base_acc)) if v is None)
        empty.budget_reason = f"GSM8K not measured for {who}: FILL IN"
        return empty
    pt = paired_test(base, r)
    pc = pt.comparison
    if pc is not None:
        d, lo, hi = pc.delta, pc.delta_ci_low, pc.delta_ci_high
        paired, method = True, (f"paired, n={pc.n}: Newcombe method-10 interval, exact McNemar "
                                f"p={pc.mcnemar_p:.3g}")
        distinguishable = not (lo <= 0.0 <= hi) and pc.mcnemar_p < 0.05
        n_pair = pc.n
        disc: float | None = (pc.base_only + pc.arm_only) / n_pair
        run_ids = f"{base.run_id}, {r.run_id}"
    else:
        bi = _wilson_of(base.accuracy)
        if interval is None or bi is None:
            empty.delta = Figure(acc_v - base_acc, FigureKind.DERIVED, f"{Metric.GSM8K_ACCURACY} difference", r.run_id,
                                 f"{(acc_v - base_acc) * 100:+.1f} pp")
            empty.budget_reason = "no interval: neither per-question records nor n were logged"
            return empty
        d = acc_v - base_acc
        lo, hi = unpaired_interval(acc_v, interval[0], interval[1], base_acc, bi[0], bi[1])
        paired, method = False, f"unpaired ({pt.cell}): Newcombe hybrid score interval from the two Wilson intervals"
        distinguishable = not (lo <= 0.0 <= hi)
        n_pair = n or 0
        disc = None
        run_ids = f"{base.run_id}, {r.run_id}"
    delta = Figure(d, FigureKind.DERIVED, f"Δ accuracy vs {base.arm} ({method}); runs {run_ids}", r.run_id,
                   f"{d * 100:+.1f} pp [{lo * 100:+.1f}, {hi * 100:+.1f}]")
    need = questions_needed(base_acc, abs(d), disc, d) if d != 0 else None
    j = AccuracyJudgement(acc, interval, n, delta, (lo, hi), paired, method, distinguishable, need, "not judged",
                          "no accuracy budget stated")
    if budget is not None:
        edge = -budget
        if lo >= edge:
            j.budget_status = "within"
            j.budget_reason = (f"Δ {d * 100:+.1f} pp, its 95% interval [{lo * 100:+.1f}, {hi * 100:+.1f}] lies above "
                               f"the −{budget * 100:g} pp budget")
        elif hi < edge:
            j.budget_status = "exceeds"
            j.budget_reason = (f"Δ {d * 100:+.1f} pp [{lo * 100:+.1f}, {hi * 100:+.1f}]: the whole interval is below "
                               f"the −{budget * 100:g} pp budget")
        else:
            j.budget_status = "crosses"
            j.n_needed_budget = questions_needed(base_acc, abs(d - edge), disc, d) if d != edge else None
            j.budget_reason = (f"with {n_pair:,} {'paired ' if paired else ''}questions Δ is {d * 100:+.1f} pp [{lo * 100:+.1f}, {hi * 100:+.1f}]: "
                               f"the interval crosses the −{budget * 100:g} pp budget, not enough to clear it")
    return j


def _rule_warnings(r: ArmRun) -> list[str]:
    v = r.verdict
    if v in (RuleVerdict.WARN, RuleVerdict.REJECT) and r.rule_ids:
        return [f"rulebook {v}: {i}" for i in r.rule_ids]
    if v in (RuleVerdict.WARN, RuleVerdict.REJECT):
        return [f"rulebook {v} (no rule id recorded)"]
    return []


def _rule_messages(r: ArmRun, uri: str | None) -> dict[str, str]:
    """The rulebook's message for each non-allow verdict, from the run's preflight/verdicts.json (when readable)."""
    try:
        items = json.loads(read_artifact(r.row, Artifact.PREFLIGHT_VERDICTS, uri) or "[]")
    except ValueError:
        return {}
    out = {}
    for v in items if isinstance(items, list) else []:
        if isinstance(v, dict) and v.get("verdict") in (RuleVerdict.WARN, RuleVerdict.REJECT) and v.get("rule") \
                and v.get("message"):
            out[f"rulebook {v['verdict']}: {v['rule']}"] = str(v["message"])
    return out


def _fallbacks(r: ArmRun) -> list[str]:
    if r.fallback.state != FallbackState.YES:
        return []
    kinds = r.fallback.kinds or "unnamed"
    ev = r.fallback.evidence
    return [f"fallback {kinds}" + (f" — {ev}" if ev else "") + f" (engine log; run {r.run_id})"]


def _kv_scales(r: ArmRun) -> str | None:
    """'1.0 — file:line: text (engine log)' for an arm with a quantized KV cache (quantrack.engines.kvscale);
    None for an unquantized one or a run that recorded none."""
    src = r.kv_scale_source
    if not src or src == "not-quantized":
        return None
    ev, planned = r.kv_scale_evidence, r.kv_scale_planned
    plan = f"; preflight planned {planned}" if planned and planned != src else ""
    return f"{src}" + (f" — {ev}" if ev else "") + f" (engine log{plan})"


def _kv_reasons(a: ArmDecision) -> list[str]:
    """The evidence lines a KV arm's verdict carries: its KV scales and the method its KL came from."""
    out = [f"KV scales: {a.kv_scales}"] if a.kv_scales else []
    if a.kl_method and a.kl.value is not None and not a.baseline:
        out.append(f"KL method: {a.kl_method}")
    return out


def contention_flags(r: ArmRun) -> list[str] | None:
    """What the run's measurement hygiene recorded (quantrack.measure.hygiene: per step yes / no / unknown and the
    reasons): the reasons of each contended step; [] when every sampled step was clean; None when the run recorded
    none (older runs, or sampling failed): the report then says 'not recorded', never 'no contention'."""
    out: list[str] = []
    sampled = False
    for step in HYGIENE_STEPS:
        state, why = r.contention_of(step).state, r.contention_of(step).reasons
        if state == ContentionState.YES:
            sampled = True
            out.append(f"{step}: {why}" if why else f"{step}: contended")
        elif state == ContentionState.NO:
            sampled = True
    return out if sampled else None


def _cost(r: ArmRun, level: int | None, tps: Figure, prices: PriceTable) -> Figure:
    from quantrack.hardware.pricing import price_summary
    from quantrack.run.schema import sweep_output_tps

    if level is None or tps.value is None:
        return Figure(None, FigureKind.UNKNOWN, "price / throughput at the SLO level", r.run_id, "—")
    cost = arm_cost(r, tps.value, prices)
    if cost is None:
        return Figure(None, FigureKind.UNKNOWN, "no price for this GPU (add it with --prices FILE)", r.run_id, "—")
    v, gpus = cost.usd_per_1m, cost.gpu_count
    ps = price_summary(cost.gpu, prices)
    return Figure(v, FigureKind.DERIVED, f"{ps['gpu']} ${ps['usd_per_hour']:g}/h x {gpus} GPU ({ps['date']}) / "
                  f"metric {sweep_output_tps(level)}", r.run_id, f"${v:.3f}" if v < 10 else f"${v:.2f}")


CANNOT_JUDGE = "cannot be judged here"


def _contended_step(r: ArmRun | None, step: str) -> str | None:
    """The reasons a run's ``step`` was flagged under contention (``'contended'`` without reasons), else None."""
    if r is None:
        return None
    c = r.contention_of(step)
    return (c.reasons or "contended") if c.state == ContentionState.YES else None


def _flagged(fig: Figure, why: list[str]) -> Figure:
    """A figure built on a figure taken under contention carries the flag: ⚠ in its text, the reasons in its
    source (the page's hover and the JSON)."""
    if not why or fig.value is None:
        return fig
    return Figure(fig.value, fig.kind, f"{fig.source}; ⚠ under contention: {'; '.join(why)}", fig.run_id,
                  f"{fig.show()} ⚠")


def _unjudged(k: SloCheck, why: str) -> SloCheck:
    """An SLO check on a figure measured under contention: neither met nor missed."""
    if k.status not in ("meets", "misses"):
        return k
    return SloCheck(k.slo, "unknown", _flagged(k.value, [why]), None,
                    f"{CANNOT_JUDGE}: {k.reason}, but the sweep ran under contention ({why}); re-run it on a quiet "
                    "machine")


def decide_arm(r: ArmRun, base: ArmRun | None, is_base: bool, c: Constraints, prices: PriceTable,
               uri: str | None) -> ArmDecision:
    from quantrack.run.schema import Metric, sweep_output_tps

    need_art = any(s.name not in ("tpot_p50", "ttft_p50") for s in c.slos)
    levels, art = arm_levels(r, uri, need_art)
    sweep_why = _contended_step(r, "sweep")
    checks = [check_slo(s, levels, r.run_id, art) for s in c.slos]
    if sweep_why:
        checks = [_unjudged(k, sweep_why) for k in checks]
    level = slo_level(c.slos, levels)
    tps = levels[level]["throughput"] if level is not None else Figure(
        None, FigureKind.UNKNOWN, "no measured level meets every SLO" if c.slos and levels else "no sweep", r.run_id, "—")
    cap = measured(r.kv_tokens_reported, Metric.KV_TOKENS_REPORTED, r, "{:,.0f}")
    pred = measured(r.kv_tokens_predicted, Metric.KV_TOKENS_PREDICTED, r, "{:,.0f}", kind=FigureKind.DERIVED)
    bcap = base.kv_tokens_reported if base is not None else None
    cap_x = (Figure(cap.value / bcap, FigureKind.DERIVED, f"{Metric.KV_TOKENS_REPORTED} / baseline's ({base.run_id})", r.run_id,
                    f"{cap.value / bcap:.2f}×") if cap.value is not None and bcap and base is not None
             else Figure(None, FigureKind.UNKNOWN, "capacity of this arm or the baseline not measured", r.run_id, "—"))
    tps_x = Figure(None, FigureKind.UNKNOWN, "baseline throughput at the same level not measured", r.run_id, "—")
    if level is not None and base is not None and tps.value is not None:
        bt = base.output_tps.get(level)
        if bt:
            tps_x = Figure(tps.value / bt, FigureKind.DERIVED, f"{sweep_output_tps(level)} / baseline's ({base.run_id})",
                           r.run_id, f"{tps.value / bt:.2f}×")
    base_why = None if is_base else _contended_step(base, "sweep")
    tps = _flagged(tps, [f"{r.arm}: {sweep_why}"] if sweep_why else [])
    tps_x = _flagged(tps_x, [w for w in (f"{r.arm}: {sweep_why}" if sweep_why else None,
                                         f"baseline: {base_why}" if base_why else None) if w])
    lat_why = _contended_step(r, "latency")
    acc = judge_accuracy(r, base, is_base, c.max_accuracy_drop)
    kl = measured(r.kl_mean, Metric.KL_MEAN, r, "{:.4f}")
    kl_method = r.kl_method or ("teacher-forced" if r.kl_mean is not None else None)
    if kl.value is not None and kl_method:
        kl = Figure(kl.value, kl.kind, f"{kl.source} ({kl_method})", kl.run_id, kl.show())
    top1 = measured(r.kl_top1_agree, Metric.KL_TOP1_AGREE, r, "{:.1%}")
    if is_base and kl.value is None:  # what the others are scored against, not a figure left unmeasured (as compare)
        kl = Figure(None, FigureKind.REFERENCE, "the baseline: every arm's KL is measured against it", r.run_id,
                    "— (baseline)")
    kl_status: KlStatus
    if is_base:
        kl_status = "reference"
    elif c.max_kl is None:
        kl_status = "not judged"
    elif kl.value is None:
        kl_status = "unknown"
    else:
        kl_status = "within" if kl.value <= c.max_kl else "exceeds"
    a = ArmDecision(
        arm=r.arm, run_id=r.run_id, status=r.status, baseline=is_base, configuration=configuration(r),
        engine=f"{r.config.engine or '?'} {r.config.engine_version or ''}".strip(),
        capacity=cap, predicted=pred, capacity_x=cap_x,
        tpot_b1=_flagged(measured(r.tpot_ms_p50, Metric.TPOT_MS_P50, r, "{:.2f} ms"), [lat_why] if lat_why else []),
        levels=levels, slo_checks=checks, slo_level=level, throughput=tps, throughput_x=tps_x,
        cost=_cost(r, level, tps, prices), acc=acc, kl=kl, top1=top1, kl_status=kl_status,
        warnings=_rule_warnings(r), fallbacks=_fallbacks(r), contention=contention_flags(r),
        kv_scales=_kv_scales(r), kl_method=kl_method)
    if a.warnings:
        a.rule_messages = _rule_messages(r, uri)
    set_verdict(a, c)
    a.load = load_explanation(r.row)
    a.reasons += a.load
    return a


def load_explanation(r: RunRow) -> list[str]:
    """What the sweep's load figures say about the arm (all measured; the engine's own where scraped): the SLO
    search's answer, goodput, and why the throughput is what it is, from KV usage / waiting / preemptions at the
    arm's highest level (an arm that never fills its KV cache gains nothing from a bigger one)."""
    from quantrack.report.compare import _top_level, sweep_levels
    from quantrack.run.schema import SWEEP_SLO_LIMIT, Tag

    out: list[str] = []
    crit = r.tags.get(Tag.SLO_SEARCH)
    if crit and r.tags.get(Tag.SLO_SEARCH_METHOD) == "probe":
        unit = "c" if r.tags.get(Tag.SLO_SEARCH_MODE) == "concurrency" else "r"
        lim, miss = r.metrics.get(SWEEP_SLO_LIMIT), r.tags.get(Tag.SLO_SEARCH_FIRST_MISS)
        met = f"{unit}{lim:g}" if lim is not None else "none"
        missed = f"{unit}{miss}" if miss and miss != "none" else "none"
        out.append(f"SLO search {crit} (search result, measured probes): the limit lies in the bracket [{met} met, "
                   f"{missed} missed]; stopped: {r.tags.get(Tag.SLO_SEARCH_STOP) or 'unknown (not recorded)'}")
    elif crit:
        unit = "c" if r.tags.get(Tag.SLO_SEARCH_MODE) == "concurrency" else "r"
        lim, miss = r.metrics.get(SWEEP_SLO_LIMIT), r.tags.get(Tag.SLO_SEARCH_FIRST_MISS)
        where = f"{unit}{lim:g}" if lim is not None else "no measured level"
        tail = (f"; first miss {unit}{miss}" if miss and miss != "none"
                else "; no measured level missed it (the limit is at least that)")
        out.append(f"SLO search {crit}: highest measured level meeting it {where}{tail} (bisection over measured "
                   "levels, never interpolated)")
    levels = sweep_levels(r.metrics)
    top = _top_level(levels)
    if top is None:
        return out
    f = levels[top]
    if f.get("goodput_rps") is not None:
        frac = f.get("goodput_fraction")
        out.append(f"goodput at {top}: {f['goodput_rps']:.3g} req/s"
                   + (f" ({frac:.0%} of requests met every per-request SLO)" if frac is not None else ""))
    kv, wait, pre = f.get("engine_kv_usage_max"), f.get("engine_waiting_max"), f.get("engine_preemptions")
    run = f.get("engine_running_max")
    if kv is not None:
        if kv >= 0.9 or (pre or 0) > 0:
            out.append(f"engine at {top}: KV cache peaked at {kv:.0%}" + (f", {pre:g} preemptions" if pre else "")
                       + (f", up to {wait:g} waiting" if wait else "") + ": capacity-bound, so more KV-cache "
                       "capacity (e.g. an FP8 KV cache) can raise throughput here")
        elif not wait:
            out.append(f"engine at {top}: KV cache peaked at {kv:.0%} with nothing waiting: the cache never filled, "
                       "so a bigger KV cache cannot raise this throughput (compute- or client-bound)")
        else:
            out.append(f"engine at {top}: KV cache peaked at {kv:.0%} with up to {wait:g} waiting: requests "
                       "queued with free cache (the engine's batch or slot limit held them)")
    elif run is not None:
        out.append(f"engine at {top}: up to {run:g} running and {wait or 0:g} waiting (it serves no KV-usage "
                   "figure)" + (": the server's slots capped the level, more KV cache would not help"
                                if wait else ""))
    return out



def set_verdict(a: ArmDecision, c: Constraints) -> None:
    reasons: list[str] = []
    if a.status != RunStatus.FINISHED:
        a.verdict = V_NOT_MEASURED
        a.reasons = [f"run {a.status}: its figures are partial" if a.status in (RunStatus.FAILED, RunStatus.KILLED)
                     else f"run {a.status}"]
        if a.status == RunStatus.REJECTED:
            a.reasons = ["rejected by preflight: never served"]
        return
    misses = [k for k in a.slo_checks if k.status == "misses"]
    unknown = [k for k in a.slo_checks if k.status == "unknown"]
    reasons += [f"misses {k.slo.label()}: {k.reason}" for k in misses]
    reasons += [f"{k.slo.label()} unknown: {k.reason}" for k in unknown]
    reasons += [f"meets {k.slo.label()}: {k.reason}" for k in a.slo_checks if k.status == "meets"]
    acc_bad = acc_unknown = False
    if not a.baseline:
        budgets = [x for x in (c.max_accuracy_drop, c.max_kl) if x is not None]
        if not budgets:
            acc_unknown = True
            reasons.append("no accuracy budget stated: accuracy not judged, the arm cannot be cleared"
                           + ("" if a.acc.accuracy.known else " (GSM8K: FILL IN)"))
        if c.max_accuracy_drop is not None:
            st = a.acc.budget_status
            if st == "within":
                reasons.append(f"accuracy within budget: {a.acc.budget_reason}")
            elif st == "exceeds":
                acc_bad = True
                reasons.append(f"accuracy over budget: {a.acc.budget_reason}")
            else:
                acc_unknown = True
                reasons.append(f"accuracy cannot be cleared: {a.acc.budget_reason}")
        elif budgets and not a.acc.accuracy.known:
            reasons.append("GSM8K: FILL IN (judged on KL only, as asked)")
        if c.max_kl is not None:
            if a.kl_status == "within":
                reasons.append(f"KL {a.kl.show()} ≤ {c.max_kl:g}")
            elif a.kl_status == "exceeds":
                acc_bad = True
                reasons.append(f"KL {a.kl.show()} > {c.max_kl:g}")
            else:
                acc_unknown = True
                reasons.append("KL not measured: the KL budget cannot be cleared")
    reasons += [f"warning: {w}" + (f" — {a.rule_messages[w]}" if w in a.rule_messages else "")
                for w in a.warnings]
    reasons += [f"warning: {w}" for w in a.fallbacks]
    reasons += _kv_reasons(a)
    if a.contention:
        reasons += [f"contention: {x}" for x in a.contention]
    if misses or acc_bad:
        a.verdict = V_MISSES
    elif unknown or acc_unknown:
        a.verdict = V_CANNOT
    else:
        a.verdict = V_CLEAR
    a.reasons = reasons
