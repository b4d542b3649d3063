"""The decision: which arm to deploy under the user's service objective, and why (pure; no mlflow, no plots).

Input: an experiment's arm runs (``tracking.load_runs``) and the user's constraints —

* latency SLOs per concurrency, ``tpot_p99<=30ms@64`` (``METRIC_STAT <= VALUE ms|s @ CONCURRENCY``), where METRIC
  and STAT are what the sweep records per level (``quantrack.measure.sweep.level_row``: ttft / tpot / e2e, each
  p50 / p90 / p99 / mean). p50 of TTFT and TPOT are run metrics (``sweep_tpot_ms_p50_c<N>``); the other
  statistics come from the run's ``sweep/sweep.json`` artifact. Nothing is interpolated between levels;
* an accuracy budget: ``--max-accuracy-drop 1pp`` (GSM8K, judged on the 95% interval of Δ — paired Newcombe from
  per-question records when both runs have them, else the unpaired Newcombe hybrid score interval from each run's
  Wilson interval) and/or ``--max-kl 0.01`` (mean KL(baseline ‖ arm) per token, measured);
* prices (``quantrack.hardware.pricing``) for the derived cost per 1M output tokens at the SLO level.

Output (``DecisionReport``): per GPU type a section with, per arm, every figure labelled measured / derived /
imported with the MLflow run id it came from, the SLO checks (goodput: the highest measured concurrency meeting
the SLO), capacity × vs baseline, throughput and cost at the SLO, accuracy Δ with its interval, whether it is
distinguishable from 0 at this n and the n needed (``quantrack.accuracy.stats``), KL, rulebook warnings,
fallbacks, contention flags, a verdict with its reasons; then the Pareto frontier of (throughput at the SLO,
accuracy), the arm to deploy and what would change the answer. An arm whose accuracy was not measured stays
FILL IN and cannot be cleared. ``quantrack.report.page`` renders it (HTML with embedded figures, or Markdown).
"""

from __future__ import annotations

import math
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.constraints import (
    Constraints,
    constraints_from_table,
    merge_constraints,
    parse_accuracy_drop,
    parse_slo,
)
from quantrack.errors import BadInput, did_you_mean
from quantrack.report.armrun import (
    ArmRun,
    arm_set,
    as_arm_runs,
    by_gpu,
    first_run_times,
    probe_fact,
)
from quantrack.report.artifacts import read_artifact
from quantrack.report.judge import (
    ArmDecision,
    decide_arm,
)
from quantrack.report.labelled import Figure, FigureKind
from quantrack.report.recommend import Section, recommend
from quantrack.run.schema import (
    Artifact,
    Role,
)

if TYPE_CHECKING:
    from quantrack.hardware.pricing import PriceTable
    from quantrack.report.audit import AuditReport
    from quantrack.store.records import RunRow
    from quantrack.study import DecisionSpec




@dataclass
class DecisionReport:
    experiment: str
    uri: str
    constraints: Constraints
    sections: list[Section]
    price_note: str = ""
    audit: AuditReport | None = None
    notes: list[str] = field(default_factory=list)
    n_runs: int = 0
    generated: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    fleet_pick: str = ""

    def decision_lines(self) -> list[str]:
        """The decision in plain lines (what `quantrack run` prints under its closing table): the recommendation,
        one line per GPU when the study measured several, then the cross-GPU pick."""
        if len(self.sections) == 1:
            lines = [f"decision: {self.sections[0].recommendation}"]
        else:
            lines = [f"decision ({s.gpu}): {s.recommendation}" for s in self.sections]
        return lines + ([f"decision: {self.fleet_pick}"] if self.fleet_pick else [])

    def to_dict(self) -> dict[str, Any]:
        def arm(a: ArmDecision) -> dict[str, Any]:
            return {
                "arm": a.arm, "run_id": a.run_id, "status": a.status, "baseline": a.baseline,
                "verdict": a.verdict, "reasons": a.reasons, "warnings": a.warnings, "fallbacks": a.fallbacks,
                "contention": a.contention, "slo_level": a.slo_level,
                "slo": [{"slo": c.slo.text or c.slo.label(), "status": c.status, "value": c.value.to_dict(),
                         "goodput_c": c.goodput_c, "reason": c.reason} for c in a.slo_checks],
                "capacity": a.capacity.to_dict(), "capacity_x": a.capacity_x.to_dict(),
                "throughput": a.throughput.to_dict(), "throughput_x": a.throughput_x.to_dict(),
                "cost": a.cost.to_dict(), "accuracy": a.acc.accuracy.to_dict(), "delta": a.acc.delta.to_dict(),
                "delta_ci": a.acc.delta_ci, "paired": a.acc.paired, "distinguishable": a.acc.distinguishable,
                "n": a.acc.n, "n_needed": a.acc.n_needed, "budget_status": a.acc.budget_status,
                "kl": a.kl.to_dict(), "top1": a.top1.to_dict(), "kl_status": a.kl_status,
                "kl_method": a.kl_method, "kv_scales": a.kv_scales, "load": a.load,
            }
        return {"experiment": self.experiment, "constraints": self.constraints.describe(),
                "sections": [{"gpu": s.gpu, "baseline": s.baseline, "frontier": s.frontier,
                              "recommended": s.recommended, "recommendation": s.recommendation,
                              "changes": s.changes, "arms": [arm(a) for a in s.arms]} for s in self.sections],
                "fleet_pick": self.fleet_pick, "notes": self.notes}


def display_uri(uri: str) -> str:
    """The store URI as the page shows it: no user:password, no query string (tokens), other secrets redacted."""
    from urllib.parse import urlsplit

    from quantrack.redact import redact_text

    try:
        u = urlsplit(uri)
    except ValueError:
        return "[REDACTED]"
    if "@" not in u.netloc and not u.query:
        return redact_text(uri)
    netloc = u.netloc if "@" not in u.netloc else "[REDACTED]@" + u.netloc.rsplit("@", 1)[1]
    return redact_text(f"{u.scheme}://{netloc}{u.path}")


# --- the whole report -------------------------------------------------------------------------------------

def _probe_for(facts: list[RunRow], gpu: str) -> tuple[dict[int, Figure], str | None]:
    """The newest FINISHED FP8 probe on this GPU type (``quantrack probe --track``): speedup per batch."""
    from quantrack.run.schema import probe_fp8_speedup

    probes = [p for p in (probe_fact(f) for f in facts) if p is not None]
    cands = [p for p in probes if p.finished and (p.gpu_name or "").lower() == gpu.lower()]
    if not cands:
        return {}, None
    f = max(cands, key=lambda x: x.start_time)
    out = {b: Figure(v, FigureKind.MEASURED, f"metric {probe_fp8_speedup(b)} (FP8 GEMM probe)", f.run_id, f"{v:.2f}×")
           for b, v in f.fp8_speedup.items()}
    return out, f.run_id


def build_report(experiment: str, runs: list[RunRow] | list[ArmRun], c: Constraints, *, uri: str = "",
                 baseline: str | None = None, prices: PriceTable | None = None,
                 node_facts: list[RunRow] | None = None, audit: bool | None = None) -> DecisionReport:
    """The decision over an experiment's arm runs (one section per GPU type)."""
    from quantrack.hardware.pricing import load_prices

    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    price_table = prices if prices is not None else load_prices(c.prices)
    arm_runs = as_arm_runs(runs)
    groups = by_gpu(arm_runs)
    from quantrack.hardware.pricing import default_prices_path

    shipped = Path(price_table.path) == default_prices_path()
    rep = DecisionReport(experiment=experiment, uri=display_uri(uri), constraints=c, sections=[], n_runs=len(runs),
                         price_note="prices: " + ("the shipped rules/prices.toml" if shipped else price_table.path))
    first_seen = first_run_times(arm_runs)
    for gpu, rs in sorted(groups.items()):
        arms = arm_set(rs, baseline, first_seen)
        base_name, base = arms.baseline, arms.base
        sec = Section(gpu=gpu, baseline=base_name, arms=[])
        for arm in arms.order:
            d = decide_arm(arms.chosen[arm], base, arm == base_name, c, price_table, uri)
            d.skipped = arms.skipped.get(arm, {})
            sec.arms.append(d)
        if base is None:
            rep.notes.append(f"{gpu}: no baseline (no arm is named bf16 or tagged baseline): pass --baseline ARM")
        sec.probe, sec.probe_run = _probe_for(node_facts or [], gpu)
        recommend(sec, c)
        rep.sections.append(sec)
    if audit if audit is not None else len(groups) > 1:
        from quantrack.report.audit import build_audit

        rep.audit = build_audit(arm_runs, node_facts=node_facts or [])
    if len(rep.sections) > 1:
        picks = [(s, next(a for a in s.arms if a.arm == s.recommended)) for s in rep.sections if s.recommended]
        priced = [(s, a) for s, a in picks if a.cost.value is not None]
        if priced:
            s, a = min(priced, key=lambda p: p[1].cost.value or math.inf)
            rep.fleet_pick = (f"Across GPU types, the cheapest cleared choice is {a.arm} on {s.gpu}: {a.cost.show()} "
                              f"per 1M output tokens at the SLO (derived).")
        elif picks:
            rep.fleet_pick = "Across GPU types: no cleared choice is priced, so no cross-GPU cost ranking."
        else:
            rep.fleet_pick = "Across GPU types: no arm clears every constraint on any GPU."
    return rep


# --- reading the store and the constraints ----------------------------------------------------------------

def study_constraints(path: str | Path) -> Constraints | None:
    """The ``[decision]`` table of a study file (read and validated by ``load_study``), or None when it has none."""
    from quantrack.study import load_study

    st = load_study(path)
    return constraints_from_spec(st.decision, st.source)


def constraints_from_spec(spec: DecisionSpec, source: str | None) -> Constraints | None:
    """A loaded study's ``DecisionSpec`` (already validated by ``load_study``) -> Constraints; None when empty."""
    if not (spec.slo or spec.max_accuracy_drop is not None or spec.max_kl is not None or spec.prices):
        return None
    where = f"study file {source!r}" if source else "the study's [decision]"
    return Constraints(
        slos=tuple(parse_slo(s, f"{where}: [decision] slo") for s in spec.slo),
        max_accuracy_drop=(None if spec.max_accuracy_drop is None
                           else parse_accuracy_drop(spec.max_accuracy_drop, f"{where}: [decision] max_accuracy_drop")),
        max_kl=spec.max_kl, prices=spec.prices, sources=(where,))


def parent_constraints(parents: list[RunRow], uri: str) -> Constraints | None:
    """The [decision] table of the study file logged on the newest study parent run (``study/study.toml``)."""
    for p in sorted(parents, key=lambda r: -r.start_time):
        text = read_artifact(p, Artifact.STUDY_STUDY, uri)
        if text is None:
            continue
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return None
        if "decision" not in data:
            return None
        return constraints_from_table(data["decision"], f"{Artifact.STUDY_STUDY} of run {p.run_id}")
    return None


def decision_report(experiment: str, flags: Constraints, *, uri: str | None = None, study: str | None = None,
                    baseline: str | None = None, gpu: str | None = None) -> DecisionReport:
    """Read the experiment (one search), its constraints (flags over ``--study``'s [decision], else the parent
    run's study file) and build the report."""
    from quantrack.hardware.pricing import load_prices
    from quantrack.report.audit import load_node_facts
    from quantrack.store.tracking import load_runs
    from quantrack.store.uri import resolve_uri

    target = resolve_uri(uri, create=False)
    base_c = study_constraints(study) if study else None
    if flags.prices:
        load_prices(flags.prices)  # a bad prices file is reported before the store is read
    runs = load_runs(experiment, target)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    if study is None:
        base_c = parent_constraints(load_runs(experiment, target, role=Role.STUDY), target)
    c = merge_constraints(flags, base_c)
    if study is None and not flags.prices and c.prices and not Path(c.prices).is_absolute():
        # the logged study file is only its text: where it lay, so what its relative path meant, is not stored
        raise BadInput(f"the study file logged on experiment {experiment!r} names [decision] prices = {c.prices!r}, "
                       "a path relative to that file, which the store does not keep: give --study FILE (the "
                       "path is read relative to it) or --prices FILE")
    arm_runs = as_arm_runs(runs)
    if gpu is not None:
        names = sorted(by_gpu(arm_runs))
        match = [n for n in names if n.lower() == gpu.lower()]
        if not match:
            raise BadInput(f"no runs on GPU {gpu!r} in experiment {experiment!r}{did_you_mean(gpu, names)}; "
                           f"GPUs: {', '.join(names)}")
        arm_runs = [r for r in arm_runs if r.config.gpu == match[0]]
    rep = build_report(experiment, arm_runs, c, uri=target, baseline=baseline, prices=load_prices(c.prices),
                       node_facts=load_node_facts(target))
    return rep


__all__ = ["DecisionReport", "build_report", "constraints_from_spec", "decision_report", "display_uri",
           "parent_constraints", "study_constraints"]
