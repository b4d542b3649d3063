"""The study table (the seeds' lab06 §4 template) built from tracked runs — pure, no mlflow here.

One row per arm (its newest finished run; a failed or rejected arm shows its newest run and status;
a footnote counts the runs of the same arm that were skipped, e.g. a Ray retry's KILLED partial run):
Configuration, Weights (GiB), Capacity (tok), Batch-1 TPOT, GSM8K, Δ vs <baseline>, plus predicted vs
reported capacity, the KV cache in MiB (llama.cpp's buffer), the derived cost per 1M output tokens at
the arm's highest measured sweep concurrency (quantrack.hardware.pricing), the paired test for Δ (exact McNemar
from per-question records), the fallback column, and top-1 agreement / KL. Any cell whose metric was not
logged reads ``FILL IN`` (cost: ``—``): nothing is ever filled from elsewhere. Which figures are measured
and which derived is in ``COLUMNS`` and in the footer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.report.armrun import (
    NO_RECORDS,
    Accuracy,
    ArmRun,
    PairedTest,
    arm_cost,
    arm_set,
    as_arm_runs,
    by_gpu,
    model_mismatch,
    paired_test,
)
from quantrack.report.compare_csv import machine_row, render_csv
from quantrack.run.schema import HYGIENE_STEPS, ContentionState, FallbackState, Metric, RunStatus, Tag

if TYPE_CHECKING:
    from quantrack.hardware.pricing import PriceTable
    from quantrack.store.records import RunRow

FILL = "FILL IN"
BASELINE_CELL = "— (baseline)"
FORMATS = ("table", "md", "csv", "json")
# the metrics the JSON view lists per arm, by their MLflow names
RAW_METRICS = (Metric.WEIGHTS_GIB, Metric.KV_TOKENS_REPORTED, Metric.KV_TOKENS_PREDICTED, Metric.CAPACITY_ERROR_PCT,
               Metric.KV_MIB_REPORTED, Metric.TPOT_MS_P50, Metric.GSM8K_ACCURACY, Metric.GSM8K_SE,
               Metric.GSM8K_CI_LOW, Metric.GSM8K_CI_HIGH, Metric.GSM8K_N, Metric.KL_TOP1_AGREE, Metric.KL_MEAN)

WIDTH = 120  # the default table fits this many columns; --wide shows every column

# (key, header, label): label says where the figure comes from.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("arm", "Arm", "run"),
    ("configuration", "Configuration", "run params: weights / KV-cache dtype"),
    ("weights_gib", "Weights (GiB)", "measured: engine startup log"),
    ("capacity_tok", "Capacity (tok)", "measured: engine startup log (KV-cache tokens)"),
    ("predicted_tok", "Predicted (tok)", "derived: quantrack.hardware.capacity"),
    ("capacity_error", "Cap. error", "derived: (reported - predicted) / predicted"),
    ("kv_mib", "KV (MiB)", "measured: engine startup log (llama.cpp KV buffer, K + V)"),
    ("tpot_ms", "Batch-1 TPOT", "measured: client, median over iterations"),
    ("cost", "{cost}", ("derived: dated GPU price per hour / measured output tok/s at the arm's highest sweep "
                        "concurrency")),
    ("gsm8k", "{task}", ("measured or imported: accuracy [95% Wilson interval] n=questions "
                        "(accuracy ± standard error where no interval was logged)")),
    ("delta", "Δ vs {baseline}", "derived: accuracy difference, percentage points"),
    ("paired_test", "Paired test", "derived: exact McNemar on per-question records"),
    ("budget", "Budget", ("derived: budget verdict vs the baseline, per arm at 95% (quantrack.accuracy.budget): "
                          "the study's sequential one where logged, else fixed-n on the paired records")),
    ("fallback", "Fallback", "measured: engine startup log"),
    ("top1_agree", "Top-1 agree", "measured: KL fidelity run"),
    ("kl", "KL", "measured: KL fidelity run (mean nats/token)"),
    ("kl_method", "KL method", "run param kl_method: teacher-forced or decode-greedy (quantrack.accuracy.kl)"),
    ("kv_scales", "KV scales", ("measured: the engine's own KV-scale lines (quantrack.engines.kvscale); "
                                "planned: preflight (quantrack.engines.kvplan), shown where it differs")),
    ("status", "Status", "run status"),
    ("contention", "Contention", ("measured: host contention while each timed step ran (quantrack.measure.hygiene); "
                                  "⚠ marks every figure built on a contended step")),
)
# Shown (in --wide, csv, md, json) when some arm's sweep recorded them (quantrack.measure.sweep: rate levels,
# p95, goodput, repeats, the engine's scraped /metrics, the SLO search); the level is the arm's highest measured.
LOAD_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sweep_level", "Sweep level", "measured: the arm's highest sweep level (cN in flight, rN requests/s)"),
    ("sweep_tps", "Sweep out tok/s", "measured: output tok/s at that level; [95% t-interval] over repeats"),
    ("sweep_tpot_p95", "TPOT p95", "measured: client TPOT p95 (ms) at that level"),
    ("goodput", "Goodput req/s", "measured: requests meeting every per-request SLO / wall time, at that level"),
    ("engine_view", "Engine KV / run / wait", ("measured by the engine: max KV-cache usage, running and waiting "
                                               "requests from its /metrics during that level (— = not served)")),
    ("prefix_hit", "Prefix hit", ("measured by the engine: prefix-cache hit rate (cached prompt tokens / prompt "
                                  "tokens) at that level, and the sweep's workload; unknown = not served, why in "
                                  "the json")),
    ("slo_limit", "SLO limit", "measured: highest measured level meeting [sweep] slo_search (first miss)"),
)


@dataclass
class CompareTable:
    experiment: str
    baseline: str | None
    rows: list[dict[str, str]]
    raw: list[dict[str, Any]] = field(default_factory=list)  # the numbers behind each row (json)
    notes: list[str] = field(default_factory=list)
    cost_header: str = "$ / 1M out tok (derived)"
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)  # arm -> {status: runs not shown}
    narrow: list[dict[str, str]] = field(default_factory=list)  # the default table's merged cells, per row
    study_running: bool = False  # a parent study run of this experiment is still RUNNING (more arms may come)
    columns: tuple[tuple[str, str, str], ...] = COLUMNS  # + LOAD_COLUMNS when an arm recorded them
    task: str = "GSM8K"  # the accuracy column's task (a task file's name when every arm with accuracy asked it)
    machine: list[dict[str, Any]] = field(default_factory=list)  # typed values per row (csv: compare_csv)

    def headers(self) -> list[str]:
        return [h.format(baseline=self.baseline or "baseline", cost=self.cost_header, task=self.task)
                for _, h, _ in self.columns]


def _skipped_note(skipped: dict[str, dict[str, int]], chosen: dict[str, ArmRun]) -> str | None:
    if not skipped:
        return None
    parts = []
    for arm in sorted(skipped):
        counts = skipped[arm]
        n = sum(counts.values())
        what = ", ".join(f"{k} {v}" for k, v in counts.items())
        st = chosen[arm].stored_status
        shown = "latest FINISHED" if st == RunStatus.FINISHED else f"latest ({st})"
        parts.append(f"{arm}: {shown} run shown, {n} other run{'s' if n != 1 else ''} skipped ({what})")
    return "several runs per arm: " + "; ".join(parts) + "."


def cost_for(r: ArmRun, prices: PriceTable) -> tuple[str, int | None, dict[str, Any] | None]:
    """The cost cell at the arm's highest measured sweep concurrency: (cell, N, figures) or ('—', None, None)."""
    from quantrack.hardware.pricing import NOT_PRICED

    tps = r.output_tps
    if not tps:
        return NOT_PRICED, None, None
    n = max(tps)
    cost = arm_cost(r, tps[n], prices)
    if cost is None:
        return NOT_PRICED, n, None
    cell = f"{cost.usd_per_1m:.3f}" if cost.usd_per_1m < 10 else f"{cost.usd_per_1m:.2f}"
    return cell, n, {"usd_per_1m_output_tokens": float(cell), "concurrency": n, "output_tok_s": tps[n],
                     "gpu": cost.gpu, "gpu_count": cost.gpu_count}


def _cost_header(ns: set[int]) -> str:
    from quantrack.hardware.pricing import cost_column

    if len(ns) == 1:
        return cost_column(next(iter(ns)))
    if not ns:
        return "$ / 1M out tok (derived)"
    return "$ / 1M out tok (derived, @cN: highest measured per arm)"


def _price_table(prices: PriceTable | str | Path | None) -> PriceTable:
    from quantrack.hardware.pricing import PriceTable, load_prices

    return prices if isinstance(prices, PriceTable) else load_prices(prices)


def gsm8k_cell(acc: Accuracy) -> str:
    """Accuracy with its 95% Wilson interval and n when logged (an SE of 0 at 0/n or n/n says nothing);
    else accuracy ± SE; else FILL IN."""
    p, se, lo, hi, n = acc.accuracy, acc.se, acc.ci_low, acc.ci_high, acc.n
    if p is None:
        return FILL
    if lo is not None and hi is not None:
        return f"{p * 100:.1f}% [{lo * 100:.1f}, {hi * 100:.1f}]" + (f" n={round(n)}" if n is not None else "")
    if se is None:
        return f"{p:.3f}"
    return f"{p:.3f} ± {se:.3f}"


def _num(x: float | None, digits: int = 2) -> str:
    return FILL if x is None else f"{x:,.{digits}f}"


def _int(x: float | None) -> str:
    return FILL if x is None else f"{round(x):,}"


def configuration(r: ArmRun) -> str:
    """'weights / KV-cache dtype KV' as logged (the effective KV dtype where the engine reported one)."""
    w, kv = r.config.weights, r.config.kv_shown
    if not w and not kv:
        return FILL
    return f"{w or FILL} / {kv or FILL} KV"


def _fallback(r: ArmRun) -> str:
    fb = r.fallback.state
    if fb is None:
        return FILL
    if fb == FallbackState.YES:
        kinds = r.fallback.kinds
        return f"yes ({kinds})" if kinds else "yes"
    return fb


def _kl_method(r: ArmRun) -> str:
    """The KL method a run's KL came from; runs without the param predate the decode-side method (teacher-forced
    was the only one)."""
    if r.kl_mean is None and r.kl_top1_agree is None:
        return "—"
    return r.kl_method or "teacher-forced"


def _kv_scales(r: ArmRun) -> str:
    seen, planned = r.kv_scale_source, r.kv_scale_planned
    if seen is None:
        return f"{FILL} (planned {planned})" if planned and planned != "not-quantized" else FILL
    return seen if not planned or planned == seen else f"{seen} (planned {planned})"


def _status(r: ArmRun) -> str:
    return "finished" if r.status == RunStatus.FINISHED else str(r.status)


def _contention_cell(r: ArmRun) -> str:
    """'latency ⚠, sweep ⚠' for the contended steps; 'none' when every sampled step was quiet; 'not recorded'."""
    states = {step: r.contention_of(step).state for step in ("latency", "sweep")}
    hit = [f"{step} ⚠" for step, st in states.items() if st == ContentionState.YES]
    if hit:
        return ", ".join(hit)
    return "none" if ContentionState.NO in states.values() else "not recorded"


def _tpot_cell(r: ArmRun) -> str:
    """Client TPOT (and the server's own per-token time where the engine reports it), ⚠ if contended."""
    if r.tpot_ms_p50 is None:
        return FILL
    cell = f"{r.tpot_ms_p50:.2f}"
    if r.server_tpot_ms is not None:
        cell += f" / {r.server_tpot_ms:.2f}"
    return cell + (" ⚠" if r.contention_of("latency").state == ContentionState.YES else "")


def _narrow_gsm8k(acc: Accuracy) -> str:
    p, lo, hi = acc.accuracy, acc.ci_low, acc.ci_high
    if p is None:
        return FILL
    if lo is None or hi is None:
        return gsm8k_cell(acc)
    d = 1 if hi - lo < 0.10 else 0  # a narrow interval (large n) keeps a decimal: [1–3] would hide it
    return f"{p * 100:.1f}% [{lo * 100:.{d}f}–{hi * 100:.{d}f}]"


def _capacity_cell(r: ArmRun) -> str:
    # llama.cpp logs both: its token figure is the context it was given (-c), the same for every arm; the
    # buffer in MiB is what the KV dtype changes, so it is the capacity figure shown
    if r.kv_mib_reported is not None:
        return f"{r.kv_mib_reported:,.2f} MiB"
    if r.kv_tokens_reported is not None:
        return f"{round(r.kv_tokens_reported):,}"
    return FILL


def _task_label(runs: Iterable[ArmRun]) -> str:
    """The accuracy column's name: the task every arm with an accuracy asked; ``accuracy`` when they differ."""
    from quantrack.run.schema import accuracy_names

    tasks = {r.accuracy.task for r in runs if r.accuracy.accuracy is not None}
    return accuracy_names(tasks.pop()).label if len(tasks) == 1 else ("GSM8K" if not tasks else "accuracy")


def _delta_cells(r: ArmRun, base: ArmRun | None, is_base: bool, acc: float | None,
                 base_acc: float | None, allow_model_mismatch: bool = False) -> tuple[str, str, PairedTest | None]:
    """The Δ cell, the paired-test cell and the test behind them (None where none was run). Two runs of different
    source models are not compared unless ``allow_model_mismatch``."""
    if is_base:
        return BASELINE_CELL, "—", None
    if base is None:
        return "n/a: no baseline", "n/a: no baseline", None
    if acc is None or base_acc is None:
        return FILL, FILL, None
    why = model_mismatch(base, r)
    if why and not allow_model_mismatch:
        cell = f"n/a: {why}; --allow-model-mismatch pairs them"
        return cell, cell, None
    pt = paired_test(base, r, allow_model_mismatch=allow_model_mismatch)
    if _paired_on_fewer(pt, r, base):
        assert pt.comparison is not None
        return f"{pt.comparison.delta * 100:+.1f} pts (paired n={pt.comparison.n:,})", pt.cell, pt
    return f"{(acc - base_acc) * 100:+.1f} pts", pt.cell, pt


def _paired_on_fewer(pt: PairedTest | None, r: ArmRun, base: ArmRun | None) -> bool:
    """The two runs answered different questions (an arm stopped by its budget test, an interrupted run): the
    difference of their accuracies would compare different question sets, so Δ is the paired one."""
    pc = pt.comparison if pt is not None else None
    return pc is not None and base is not None and (pc.n != r.accuracy.n or pc.n != base.accuracy.n)


def build_table(experiment: str, runs: Iterable[RunRow | ArmRun], baseline: str | None = None,
                prices: PriceTable | str | Path | None = None, budget: float | None = None,
                allow_model_mismatch: bool = False) -> CompareTable:
    """Rows for every arm of the experiment, in the order the arms were first run.

    ``prices``: a PriceTable or a prices TOML (``--prices FILE``); None: the shipped rules/prices.toml."""
    price_table = _price_table(prices)
    arms = arm_set(as_arm_runs(runs), baseline)
    chosen, order, base_name, base = arms.chosen, arms.order, arms.baseline, arms.base
    table = CompareTable(experiment=experiment, baseline=base_name, rows=[], skipped=arms.skipped,
                         task=_task_label(chosen[a] for a in order))
    base_acc = base.accuracy.accuracy if base else None
    costs = {arm: cost_for(chosen[arm], price_table) for arm in order}
    cost_ns = {n for _, n, _ in costs.values() if n is not None}
    table.cost_header = _cost_header(cost_ns)
    for arm in order:
        r = chosen[arm]
        acc = r.accuracy.accuracy
        gsm = gsm8k_cell(r.accuracy)
        cost, cost_n, cost_info = costs[arm]
        if len(cost_ns) > 1 and cost_n is not None and cost_info is not None:
            cost = f"{cost} @c{cost_n}"
        # a figure built on a step measured under contention carries the flag, in every format
        lat_flag = " ⚠" if r.contention_of("latency").state == ContentionState.YES else ""
        if cost_info is not None and r.contention_of("sweep").state == ContentionState.YES:
            cost = f"{cost} ⚠"
        delta, test, pt = _delta_cells(r, base, arm == base_name, acc, base_acc, allow_model_mismatch)
        test_info = pt.to_dict() if pt is not None else None
        budget_cell, budget_info = _budget(r, pt, budget, arm == base_name)
        if budget_info is not None and budget_info.get("verdict") == "within" and r.fallback.state == FallbackState.YES:
            budget_cell += " (fallback!)"  # cleared on accuracy is not recommended: the node ran a slower path
        cap_err = r.capacity_error_pct
        row = {
            "arm": arm,
            "configuration": configuration(r),
            "weights_gib": _num(r.weights_gib),
            "capacity_tok": _int(r.kv_tokens_reported),
            "predicted_tok": _int(r.kv_tokens_predicted),
            "capacity_error": FILL if cap_err is None else f"{cap_err:+.2f}%",
            "kv_mib": _num(r.kv_mib_reported),
            "tpot_ms": FILL if r.tpot_ms_p50 is None else f"{r.tpot_ms_p50:.2f} ms" + lat_flag,
            "cost": cost,
            "gsm8k": gsm,
            "delta": delta,
            "paired_test": test,
            "budget": budget_cell,
            "fallback": _fallback(r),
            # the baseline's own fidelity is not "not measured": it is what the others are scored against
            "top1_agree": (BASELINE_CELL if arm == base_name else FILL) if r.kl_top1_agree is None
            else f"{r.kl_top1_agree * 100:.1f}%",
            "kl": (BASELINE_CELL if arm == base_name else FILL) if r.kl_mean is None else f"{r.kl_mean:.4f}",
            "kl_method": _kl_method(r),
            "kv_scales": _kv_scales(r),
            "status": _status(r),
            "contention": _contention_cell(r),
        }
        load = load_cells(r)
        if load is not None:
            row.update(load[0])
        table.rows.append(row)
        is_base = arm == base_name
        p = pt.comparison.mcnemar_p if pt is not None and pt.comparison is not None else None
        measured_fid = r.kl_top1_agree is not None or r.kl_mean is not None
        if not measured_fid:
            fid = BASELINE_CELL if is_base else FILL
        else:  # the baseline's own figures are a self-check (it is scored against a second copy of itself)
            fid = f"{row['top1_agree']} / {row['kl']}" + (" (self)" if is_base else "")
        table.narrow.append({
            "arm": arm, "configuration": row["configuration"].replace(" KV", ""), "weights_gib": row["weights_gib"],
            "capacity": _capacity_cell(r), "tpot": _tpot_cell(r), "gsm8k": _narrow_gsm8k(r.accuracy),
            "delta": delta if p is None else f"{delta} (p={p:.2g})", "budget": budget_cell, "fidelity": fid,
            "fallback": row["fallback"],
            "cost": cost, "status": row["status"],
        })
        table.raw.append({
            "arm": arm, "run_id": r.run_id, "status": r.stored_status, "verdict": r.verdict,
            "weights": r.config.weights, "kv_cache_dtype": r.config.kv_cache_dtype,
            "metrics": {k: r.metrics.get(k) for k in RAW_METRICS},
            "cost": cost_info,
            "skipped_runs": table.skipped.get(arm, {}),
            "delta_vs_baseline": (None if arm == base_name or acc is None or base_acc is None else
                                  pt.comparison.delta if pt is not None and pt.comparison is not None
                                  and _paired_on_fewer(pt, r, base) else acc - base_acc),
            "paired_test": test_info,
            "budget": budget_info,
            "fallback": r.fallback.state, "fallback_kinds": r.fallback.kinds,
            "kl_method": r.kl_method, "kv_scale_source": r.kv_scale_source,
            "kv_scale_planned": r.kv_scale_planned, "kv_scale_evidence": r.kv_scale_evidence,
            "contention": {step: {"state": r.contention_of(step).state, "reasons": r.contention_of(step).reasons}
                           for step in HYGIENE_STEPS},
        })
        if load is not None:
            table.raw[-1].update(_load_raw(r, load[1]))
        levels = sweep_levels(r.metrics)
        table.machine.append(machine_row(
            r, is_base=is_base, delta=table.raw[-1]["delta_vs_baseline"], pt=pt, paired_cell=test,
            cost=cost_info, budget=budget_info, levels=levels or None, top=_top_level(levels)))
    _add_load_columns(table)
    judged = [raw["arm"] for raw in table.raw if raw.get("budget")]
    if judged:
        table.notes.append(
            f"Budget: a verdict per arm at 95% (each 'within' or 'exceeds' wrong with probability at most 2.5%); "
            f"{len(judged)} arm(s) judged against one baseline, so all verdicts hold together with probability at "
            f"least {100 - 2.5 * len(judged):g}% (Bonferroni). 'within' on accuracy is not a recommendation: "
            "an arm with a fallback is marked. '(seq.)': the study's sequential test, stopped when it settled; "
            "such an arm's Δ and p are on the questions asked before it stopped, at a point the data chose, so "
            "they are not a test of a difference (the budget's confidence sequence is).")
    if base_name is None and chosen:
        table.notes.append("no baseline: pass --baseline ARM (no arm is named bf16 or tagged as baseline)")
    table.notes.append("measured: weights, capacity and KV MiB (engine log), TPOT (client), GSM8K (eval), fallback "
                       "(log); derived: predicted capacity, capacity error, cost, Δ, paired test. "
                       "GSM8K: accuracy [95% Wilson interval] n=questions. "
                       "* = Δ's 95% interval excludes 0. FILL IN = not measured.")
    priced = [arm for arm in order if costs[arm][2] is not None]
    if priced:
        from quantrack.hardware.pricing import price_summary

        seen: dict[str, str] = {}
        for arm in priced:
            info = costs[arm][2]
            assert info is not None
            ps = price_summary(info["gpu"], price_table)
            seen.setdefault(ps["gpu"], f"{ps['gpu']} ${ps['usd_per_hour']:g}/h ({ps['date']}, {ps['provider'] or 'list'})")
        table.notes.append("cost = price per GPU-hour x GPUs / (measured output tok/s x 3600) x 1e6 at the arm's "
                           f"highest sweep concurrency; prices: {'; '.join(seen.values())} from {price_table.path}. "
                           "— = no price or no sweep.")
    else:
        table.notes.append("cost: — (no arm has both a measured sweep throughput and a GPU price; "
                           "add a price with --prices FILE).")
    table.notes.extend(_contention_notes(arms.runs()))
    quick = [a for a in order if chosen[a].quick]
    if quick:
        table.notes.append("--quick runs (" + ", ".join(quick) + "): a few requests per step, a first look; "
                           "run the study without --quick for figures to decide on.")
    skipped = _skipped_note(table.skipped, chosen)
    if skipped:
        table.notes.append(skipped)
    return table


def sweep_levels(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """{level label (c16 / r2.5): {figure: value}} from the sweep metrics (``sweep_<figure>_<level>``)."""
    from quantrack.run.schema import SWEEP_LEVEL

    out: dict[str, dict[str, float]] = {}
    for k, v in metrics.items():
        m = SWEEP_LEVEL.match(k)
        if m and isinstance(v, (int, float)) and math.isfinite(v):
            figure, level = m.group(1), m.group(2)
            if figure == "output_tps" or figure.startswith(("tpot_ms", "ttft_ms", "e2e_ms", "goodput", "engine_",
                                                            "output_tps_ci", "achieved_rate", "request_tps")):
                out.setdefault(level, {})[figure] = float(v)
    return out


def _top_level(levels: dict[str, dict[str, float]]) -> str | None:
    conc = [k for k in levels if k.startswith("c") and k[1:].isdigit()]
    if conc:
        return max(conc, key=lambda k: int(k[1:]))
    rates = []
    for k in levels:
        try:
            rates.append((float(k[1:]), k))
        except ValueError:
            continue
    return max(rates)[1] if rates else None


def load_cells(run: RunRow | ArmRun) -> tuple[dict[str, str], dict[str, dict[str, float]]] | None:
    """The load columns of one arm (None when its sweep recorded none of the load figures)."""
    from quantrack.run.schema import SWEEP_SLO_LIMIT

    r = run.row if isinstance(run, ArmRun) else run
    levels = sweep_levels(r.metrics)
    richer = any(f.startswith(("tpot_ms_p95", "goodput", "engine_", "output_tps_ci")) for lv in levels.values()
                 for f in lv)
    if not richer:
        return None
    top = _top_level(levels)
    figs = levels.get(top or "", {})
    tps = figs.get("output_tps")
    cell = FILL if tps is None else f"{tps:,.1f}"
    if tps is not None and figs.get("output_tps_ci_low") is not None and figs.get("output_tps_ci_high") is not None:
        cell += f" [{figs['output_tps_ci_low']:,.1f}–{figs['output_tps_ci_high']:,.1f}]"
    if top and top.startswith("r") and figs.get("achieved_rate") is not None:
        top_cell = f"{top}/s (achieved {figs['achieved_rate']:.2f})"
    else:
        top_cell = top or FILL

    def num(k: str, d: int = 2) -> str:
        return "—" if figs.get(k) is None else f"{figs[k]:,.{d}f}"

    engine = " / ".join((num("engine_kv_usage_max"), num("engine_running_max", 0), num("engine_waiting_max", 0)))
    crit = r.tags.get(Tag.SLO_SEARCH)
    lim = r.metrics.get(SWEEP_SLO_LIMIT)
    if crit:
        unit = "c" if r.tags.get(Tag.SLO_SEARCH_MODE) == "concurrency" else "r"
        miss = r.tags.get(Tag.SLO_SEARCH_FIRST_MISS)
        if r.tags.get(Tag.SLO_SEARCH_METHOD) == "probe":  # a search result: the bracket, never a point alone
            slo = (f"[{unit}{lim:g} met" if lim is not None else "[none met") + ", " + \
                (f"{unit}{miss} missed]" if miss and miss != "none" else "none missed]") + f" ({crit}; probed)"
        else:
            slo = (f"{unit}{lim:g}" if lim is not None else "none") + f" ({crit}; first miss " \
                f"{(unit + miss) if miss and miss != 'none' else 'none'})"
    else:
        slo = "— (no slo_search)"
    hit = figs.get("engine_prefix_hit_rate")
    dataset = r.tags.get(Tag.SWEEP_DATASET)
    prefix = ("unknown" if hit is None else f"{hit:.1%}") + (f" ({dataset})" if dataset else "")
    return ({"sweep_level": top_cell, "sweep_tps": cell, "sweep_tpot_p95": num("tpot_ms_p95"),
             "goodput": num("goodput_rps", 3) if figs.get("goodput_rps") is not None else "— (no goodput SLO)",
             "engine_view": engine, "prefix_hit": prefix, "slo_limit": slo}, levels)


def _load_raw(r: ArmRun, levels: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The json's load figures of one arm: its levels, and why its prefix-cache hit rate is unknown (if it is)."""
    out: dict[str, Any] = {"sweep_levels": levels}
    why = r.row.tags.get(Tag.SWEEP_PREFIX_UNKNOWN)
    if why:
        out["prefix_cache_unknown"] = why
    return out


def _add_load_columns(table: CompareTable) -> None:
    if any("sweep_level" in row for row in table.rows):
        table.columns = COLUMNS + LOAD_COLUMNS
        for row in table.rows:
            for k, _, _ in LOAD_COLUMNS:
                row.setdefault(k, FILL)
        table.notes.extend(_noise_notes(table))


def _noise_notes(table: CompareTable) -> list[str]:
    """Arms whose top-level throughput intervals (repeats) overlap the baseline's: the difference is within
    run-to-run noise."""
    from quantrack.measure.load import within_noise

    def interval(raw: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
        levels = raw.get("sweep_levels") or {}
        top = _top_level(levels)
        f = levels.get(top or "", {})
        if f.get("output_tps_ci_low") is None:
            return top, None
        return top, {"ci95_low": f["output_tps_ci_low"], "ci95_high": f["output_tps_ci_high"]}

    base = next((x for x in table.raw if x["arm"] == table.baseline), None)
    if base is None:
        return []
    bl, bi = interval(base)
    same = []
    for x in table.raw:
        if x is base:
            continue
        lvl, xi = interval(x)
        if lvl == bl and within_noise(bi, xi):
            same.append(x["arm"])
    if not same:
        return []
    return [(f"≈ sweep throughput of {', '.join(same)} at {bl} lies within run-to-run noise of {table.baseline} "
             "(their 95% intervals over repeats overlap): not a measured difference.")]


def _contention_notes(runs: list[ArmRun]) -> list[str]:
    """One note per step whose figures were taken under contention, naming the arms and why; and one for
    the arms whose runs recorded no hygiene at all (their latency may or may not have been contended)."""
    notes = []
    for step in HYGIENE_STEPS:
        hit = [(r.arm, r.contention_of(step).reasons) for r in runs
               if r.contention_of(step).state == ContentionState.YES]
        if hit:
            notes.append(f"⚠ {step} figures taken under contention (not a property of the arm): "
                         + "; ".join(f"{a}: {why}" for a, why in hit) + ".")
    unknown = [r.arm for r in runs if r.tpot_ms_p50 is not None
               and r.contention_of("latency").state == ContentionState.UNKNOWN]
    if unknown:
        notes.append("host contention during latency not recorded for: " + ", ".join(unknown) + ".")
    return notes


# The default table: the decision columns, merged so that it fits WIDTH columns; --wide gives COLUMNS.
NARROW: tuple[tuple[str, str], ...] = (
    ("arm", "Arm"), ("configuration", "Weights / KV"), ("weights_gib", "Wt GiB"), ("capacity", "KV {kvunit}"),
    ("tpot", "TPOT ms{srv}"), ("gsm8k", "{task} [95% CI]"), ("delta", "Δ vs {baseline}"), ("budget", "Budget"),
    ("fidelity", "Top-1 / KL"), ("fallback", "Fallback"), ("cost", "{cost}"), ("status", "Status"),
)
# Columns the default table leaves out when every row holds the same uninformative value (a note says so).
_DROPPABLE = {"cost": ("—",), "status": ("finished",), "fallback": ("no",), "budget": ("—",)}
_DROP_NOTE = {"cost": "", "status": "every arm finished", "fallback": "no fallback in any log", "budget": ""}


def render_narrow(table: CompareTable, width: int = WIDTH) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    srv = " (client / server)" if any(" / " in r["tpot"] for r in table.narrow) else ""
    caps = {r["capacity"] for r in table.narrow} - {FILL}
    kvunit = "MiB" if caps and all(c.endswith(" MiB") for c in caps) else (
        "tokens" if caps and not any(c.endswith(" MiB") for c in caps) else "(tokens | MiB)")
    rows = [dict(r, capacity=r["capacity"].removesuffix(" MiB")) for r in table.narrow] if kvunit == "MiB" \
        else table.narrow
    cols = [(k, h.format(baseline=table.baseline or "baseline", cost="$ / 1M tok", srv=srv, kvunit=kvunit,
                         task=table.task))
            for k, h in NARROW]
    dropped = []
    for key, same in _DROPPABLE.items():
        if rows and all(r[key] in same for r in rows):
            cols = [c for c in cols if c[0] != key]
            dropped.append("every arm logged so far finished" if key == "status" and table.study_running
                           else _DROP_NOTE[key])
    import tabulate as _tabulate_module  # type: ignore[import-untyped]

    def _text(cs: list[tuple[str, str]]) -> str:
        pad = _tabulate_module.MIN_PADDING
        _tabulate_module.MIN_PADDING = 0  # columns as wide as their widest cell: the decision table must fit
        try:
            return tabulate([[r[k] for k, _ in cs] for r in rows], headers=[h for _, h in cs], tablefmt="simple",
                            disable_numparse=True)
        finally:
            _tabulate_module.MIN_PADDING = pad

    text = _text(cols)
    for key in ("cost", "weights_gib", "configuration"):  # still too wide: these are in --wide, said so
        if max(len(ln) for ln in text.splitlines()) <= width:
            break
        if any(c[0] == key for c in cols):
            cols = [c for c in cols if c[0] != key]
            dropped.append(f"column {key} left out to fit {width} characters (see --wide)")
            text = _text(cols)
    notes = [n for n in table.notes if not n.startswith("measured:")]
    legend = ("measured: weights, KV capacity (engine log), TPOT (client; server's own where shown), "
              f"{table.task}, top-1/KL; derived: Δ (paired exact McNemar p), cost. FILL IN = not measured. "
              "All columns: --wide.")
    lines = [f"experiment: {table.experiment}   baseline: {table.baseline or 'none'}", text, "", legend]
    dropped = [d for d in dropped if d]  # the cost note below already says why cost is —
    if dropped:
        lines.append("; ".join(dropped) + ".")
    lines.extend(notes)
    import textwrap

    out = []
    for ln in lines:
        out.extend(textwrap.wrap(ln, width) if len(ln) > width and ln is not text else [ln])
    return "\n".join(out) + "\n"


def render(table: CompareTable, fmt: str = "table", wide: bool = False) -> str:
    if fmt == "table" and not wide and table.narrow:
        return render_narrow(table)
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}{did_you_mean(fmt, FORMATS)}; formats: {', '.join(FORMATS)}")
    headers = table.headers()
    keys = [k for k, _, _ in table.columns]
    body = [[row[k] for k in keys] for row in table.rows]
    if fmt == "json":
        return json.dumps({
            "experiment": table.experiment, "baseline": table.baseline,
            "columns": [{"key": k, "header": h, "source": s} for (k, _, s), h in zip(table.columns, headers)],
            "rows": table.rows, "values": table.raw, "fill_in": FILL, "notes": table.notes,
        }, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":  # for machines: typed columns, not the reader's cells (quantrack.report.compare_csv)
        return render_csv(table.machine)
    from tabulate import tabulate  # type: ignore[import-untyped]

    if not body:
        return f"experiment {table.experiment!r}: no arm runs\n"
    if fmt == "md":
        text = tabulate(body, headers=headers, tablefmt="pipe", disable_numparse=True)
        notes = "".join(f"\n\n_{n}_" for n in table.notes)
        return f"{text}{notes}\n"
    text = tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True)
    notes = "".join(f"\n{n}" for n in table.notes)
    return f"experiment: {table.experiment}   baseline: {table.baseline or 'none'}\n{text}\n{notes}\n"


def _budget(r: ArmRun, pt: PairedTest | None, budget: float | None, is_base: bool
            ) -> tuple[str, dict[str, Any] | None]:
    """The budget cell and its figures: the verdict the study logged (sequential, against its own baseline run)
    when it judged the same budget, else the fixed-n verdict on the paired test's records when a budget is given."""
    from quantrack.accuracy.budget import fixed_verdict
    from quantrack.run.schema import Metric, Tag

    if is_base:
        return "—", None
    t, m = r.row.tags, r.metrics
    logged = t.get(Tag.BUDGET_VERDICT)
    logged_pp = m.get(Metric.BUDGET_PP)
    if logged and (budget is None or (logged_pp is not None and abs(logged_pp - budget * 100) < 1e-9)):
        used = m.get(Metric.BUDGET_QUESTIONS_USED)
        info = {"verdict": logged, "method": t.get(Tag.BUDGET_METHOD), "budget_pp": logged_pp,
                "low": m.get(Metric.BUDGET_LOW_PP), "high": m.get(Metric.BUDGET_HIGH_PP),
                "questions_used": None if used is None else int(used), "baseline": t.get(Tag.BUDGET_BASELINE),
                "more_questions": m.get(Metric.BUDGET_MORE_QUESTIONS)}
        n = "" if used is None else f" n={int(used):,}"
        return f"{logged} {logged_pp:g}pp{n} (seq.)", info
    if budget is None or pt is None or pt.comparison is None:
        return "—", None
    v = fixed_verdict(pt.comparison, budget)
    return f"{v.verdict} {v.budget_pp:g}pp n={v.questions_used:,}", v.to_dict()


def compare_experiment(experiment: str, baseline: str | None = None, uri: str | None = None,
                       prices: str | Path | None = None) -> CompareTable:
    """Read the experiment's arm runs (one search) and build the table (``prices``: ``--prices FILE``)."""
    from quantrack.store.tracking import load_runs

    price_table = _price_table(prices)  # a bad prices file is reported before the store is read
    runs = load_runs(experiment, uri)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    return _mark_running(build_table(experiment, runs, baseline, price_table), experiment, uri)


def _mark_running(table: CompareTable, experiment: str, uri: str | None) -> CompareTable:
    """A study of this experiment still running (its parent run RUNNING): the table says so, never 'every arm
    finished' about the arms logged so far."""
    from quantrack.store.tracking import load_runs

    running = [r for r in load_runs(experiment, uri, role="study") if r.status == "RUNNING"]
    if running:
        table.study_running = True
        names = ", ".join(sorted({r.run_name for r in running}))
        table.notes.insert(0, f"study still running ({names}): the arms below are those logged so far; "
                              "more may come.")
    return table


def compare_by_gpu(experiment: str, baseline: str | None = None, uri: str | None = None,
                   prices: str | Path | None = None, gpu: str | None = None,
                   budget: float | None = None, allow_model_mismatch: bool = False) -> list[CompareTable]:
    """One table per GPU in the experiment (a fleet study runs the same arms on several GPU types: each GPU's
    arms are compared against that GPU's baseline); a single-GPU experiment gives the one usual table.
    ``gpu`` keeps only that GPU's runs (matched case-insensitively against the names the runs logged)."""
    from quantrack.store.tracking import load_runs

    price_table = _price_table(prices)
    runs = load_runs(experiment, uri)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    groups = by_gpu(as_arm_runs(runs))
    if gpu is not None:
        match = [g for g in groups if g.lower() == gpu.lower()]
        if not match:
            raise BadInput(f"no runs on GPU {gpu!r} in experiment {experiment!r}{did_you_mean(gpu, groups)}; "
                           f"GPUs: {', '.join(sorted(groups))}")
        groups = {match[0]: groups[match[0]]}
    if len(groups) == 1:
        return [_mark_running(build_table(experiment, next(iter(groups.values())), baseline, price_table, budget,
                                          allow_model_mismatch), experiment, uri)]
    return [_mark_running(build_table(f"{experiment} @ {g}", rs, baseline, price_table, budget, allow_model_mismatch),
                          experiment, uri) for g, rs in sorted(groups.items())]


def render_many(tables: list[CompareTable], fmt: str = "table", wide: bool = False) -> str:
    """Render one or several tables (JSON: the single table's object, or {"tables": [...]} for several)."""
    if len(tables) == 1:
        return render(tables[0], fmt, wide)
    if fmt == "json":
        return json.dumps({"tables": [json.loads(render(t, "json")) for t in tables]}, indent=2,
                          ensure_ascii=False) + "\n"
    if fmt == "csv":  # one header; the gpu column tells the tables apart
        return render_csv([row for t in tables for row in t.machine])
    return "\n".join(render(t, fmt, wide) for t in tables)


__all__ = ["FILL", "FORMATS", "NO_RECORDS", "CompareTable", "build_table", "compare_by_gpu",
           "compare_experiment", "configuration", "cost_for", "gsm8k_cell", "render", "render_many"]
