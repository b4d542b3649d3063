"""`compare --format csv`: the study table for machines — one typed value per cell, pure, no mlflow here.

The table/md/json views show cells for a reader (`213.45 ms ⚠`, `"4,096"`, `0.0% [0.0, 27.8] n=10`); a CSV is
read by pandas, R or a spreadsheet, so here every figure is a bare number in its own column (no unit, no
thousands separator, no marker), every flag is its own true/false column, every interval bound and count is its
own column, and a figure that was not measured is an empty cell (never ``FILL IN`` or ``—`` in a numeric column).
Units are in the column names (``_ms``, ``_gib``, ``_pp``); fractions are 0–1. ``CSV_COLUMNS`` says what each
column is and where it comes from; docs/tracking.md lists them.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

from quantrack.run.schema import ContentionState, FallbackState, RunStatus, Tag

if TYPE_CHECKING:
    from quantrack.report.armrun import ArmRun, PairedTest

NUMBER, INT, FLAG, TEXT = "number", "int", "flag", "text"

# (column, kind, what it is): kind NUMBER / INT are numeric columns (empty = not measured), FLAG is true/false
# (empty = not recorded), TEXT is a label.
CSV_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu", TEXT, "run param: NVML's GPU name, else the study's catalog GPU (a fleet study has several)"),
    ("arm", TEXT, "run"),
    ("run_id", TEXT, "the MLflow run shown for the arm (its newest finished one)"),
    ("status", TEXT, "run status"),
    ("is_baseline", FLAG, "the arm Δ is against"),
    ("weights", TEXT, "run param: weights dtype"),
    ("kv_cache_dtype", TEXT, "run param: KV-cache dtype (the engine's effective one where it reported one)"),
    ("weights_gib", NUMBER, "measured: engine startup log, GiB"),
    ("capacity_tok", INT, "measured: engine startup log, KV-cache tokens"),
    ("predicted_tok", INT, "derived: quantrack.hardware.capacity, KV-cache tokens"),
    ("capacity_error_pct", NUMBER, "derived: (reported - predicted) / predicted, percent"),
    ("kv_mib", NUMBER, "measured: engine startup log (llama.cpp KV buffer, K + V), MiB"),
    ("tpot_ms", NUMBER, "measured: client batch-1 TPOT, median over iterations, ms"),
    ("server_tpot_ms", NUMBER, "measured: the engine's own per-token time, ms (where the engine reports it)"),
    ("tpot_contended", FLAG, "measured: the latency step ran under host contention (empty: not recorded)"),
    ("usd_per_1m_out_tok", NUMBER, ("derived: dated GPU price per hour / measured output tok/s at the arm's "
                                    "highest sweep concurrency, USD")),
    ("cost_concurrency", INT, "the sweep concurrency the cost is at"),
    ("cost_contended", FLAG, "measured: the sweep behind the cost ran under host contention (empty: not recorded)"),
    ("gsm8k_acc", NUMBER, "measured or imported: GSM8K accuracy, fraction 0-1"),
    ("gsm8k_lo", NUMBER, "95% Wilson interval, low bound, fraction"),
    ("gsm8k_hi", NUMBER, "95% Wilson interval, high bound, fraction"),
    ("gsm8k_n", INT, "questions scored"),
    ("gsm8k_se", NUMBER, "standard error, fraction (imports without an interval)"),
    ("gsm8k_source", TEXT, "measured, or imported: <file>"),
    ("accuracy_task", TEXT, ("the task the gsm8k_* columns hold: gsm8k, or a task file's name (the run's metric "
                             "prefix; the column names stay fixed so every table has one header)")),
    ("delta_pp", NUMBER, "derived: accuracy minus the baseline's, percentage points (empty for the baseline)"),
    ("paired_p", NUMBER, "derived: exact McNemar p on the questions both runs answered"),
    ("paired_n", INT, "questions both runs answered"),
    ("paired_delta_lo_pp", NUMBER, "derived: Newcombe 95% interval of the paired Δ, low bound, points"),
    ("paired_delta_hi_pp", NUMBER, "derived: Newcombe 95% interval of the paired Δ, high bound, points"),
    ("paired_significant", FLAG, "the paired Δ's 95% interval excludes 0 (the table's *)"),
    ("paired_note", TEXT, "why there is no paired test (no baseline, no per-question records, ...)"),
    ("budget_verdict", TEXT, "derived: within / exceeds / undecided (quantrack.accuracy.budget)"),
    ("budget_pp", NUMBER, "the accuracy budget judged, points"),
    ("budget_n", INT, "paired questions the verdict used"),
    ("budget_method", TEXT, "sequential (the study's) or fixed-n"),
    ("fallback", FLAG, "measured: engine startup log names a fallback kernel (empty: the log could not say)"),
    ("fallback_kinds", TEXT, "which fallback"),
    ("top1_agree", NUMBER, "measured: KL fidelity run, top-1 agreement with the baseline, fraction"),
    ("kl_mean", NUMBER, "measured: KL fidelity run, mean nats/token"),
    ("kl_method", TEXT, "teacher-forced or decode-greedy (quantrack.accuracy.kl)"),
    ("kv_scales", TEXT, "measured: the engine's own KV-scale lines (quantrack.engines.kvscale)"),
    ("kv_scales_planned", TEXT, "planned: preflight (quantrack.engines.kvplan)"),
    ("latency_contended", FLAG, "measured: host contention during the latency step (empty: not recorded)"),
    ("sweep_contended", FLAG, "measured: host contention during the sweep (empty: not recorded)"),
    ("sweep_level", TEXT, "the arm's highest sweep level: cN in flight or rN requests/s"),
    ("sweep_out_tps", NUMBER, "measured: output tok/s at that level"),
    ("sweep_out_tps_lo", NUMBER, "95% t-interval over repeats, low bound, tok/s"),
    ("sweep_out_tps_hi", NUMBER, "95% t-interval over repeats, high bound, tok/s"),
    ("sweep_achieved_rate", NUMBER, "measured: achieved requests/s at a rate level"),
    ("sweep_tpot_p95_ms", NUMBER, "measured: client TPOT p95 at that level, ms"),
    ("goodput_rps", NUMBER, "measured: requests meeting every per-request SLO / wall time, req/s"),
    ("engine_kv_usage_max", NUMBER, "measured by the engine (/metrics): max KV-cache usage, fraction"),
    ("engine_running_max", NUMBER, "measured by the engine (/metrics): max running requests"),
    ("engine_waiting_max", NUMBER, "measured by the engine (/metrics): max waiting requests"),
    ("prefix_hit_rate", NUMBER, "measured by the engine: prefix-cache hit rate at that level, fraction"),
    ("sweep_dataset", TEXT, "the sweep's workload"),
    ("slo_search", TEXT, "the [sweep] slo_search criterion"),
    ("slo_limit", NUMBER, "measured: highest level meeting slo_search (in the level's unit)"),
    ("slo_first_miss", TEXT, "lowest measured level missing it (none: no miss)"),
)
NUMERIC = tuple(k for k, kind, _ in CSV_COLUMNS if kind in (NUMBER, INT))
FLAGS = tuple(k for k, kind, _ in CSV_COLUMNS if kind == FLAG)


def _flag(state: str | None) -> bool | None:
    """yes -> True, no -> False, anything else (unknown, not recorded) -> None (an empty cell)."""
    if state in (ContentionState.YES, FallbackState.YES):
        return True
    if state in (ContentionState.NO, FallbackState.NO):
        return False
    return None


def _int(x: float | None) -> int | None:
    return None if x is None else round(x)


def _pp(x: float | None) -> float | None:
    return None if x is None else x * 100


def machine_row(r: ArmRun, *, is_base: bool, delta: float | None, pt: PairedTest | None, paired_cell: str,
                cost: dict[str, Any] | None, budget: dict[str, Any] | None,
                levels: dict[str, dict[str, float]] | None, top: str | None) -> dict[str, Any]:
    """One arm's typed CSV values (None = empty cell), keyed by ``CSV_COLUMNS``; ``delta`` as a fraction;
    ``levels`` the arm's sweep levels and ``top`` its highest (quantrack.report.compare picks it)."""
    from quantrack.run.schema import SWEEP_SLO_LIMIT

    acc, pc = r.accuracy, (pt.comparison if pt is not None else None)
    lat, swp = _flag(r.contention_of("latency").state), _flag(r.contention_of("sweep").state)
    row: dict[str, Any] = {
        "gpu": r.config.gpu, "arm": r.arm, "run_id": r.run_id,
        "status": "finished" if r.status == RunStatus.FINISHED else str(r.status), "is_baseline": is_base,
        "weights": r.config.weights, "kv_cache_dtype": r.config.kv_shown,
        "weights_gib": r.weights_gib, "capacity_tok": _int(r.kv_tokens_reported),
        "predicted_tok": _int(r.kv_tokens_predicted), "capacity_error_pct": r.capacity_error_pct,
        "kv_mib": r.kv_mib_reported, "tpot_ms": r.tpot_ms_p50, "server_tpot_ms": r.server_tpot_ms,
        "tpot_contended": None if r.tpot_ms_p50 is None else lat,
        "usd_per_1m_out_tok": None if cost is None else cost["usd_per_1m_output_tokens"],
        "cost_concurrency": None if cost is None else cost["concurrency"],
        "cost_contended": None if cost is None else swp,
        "gsm8k_acc": acc.accuracy, "gsm8k_lo": acc.ci_low, "gsm8k_hi": acc.ci_high, "gsm8k_n": _int(acc.n),
        "gsm8k_se": acc.se, "gsm8k_source": acc.source if acc.accuracy is not None else None,
        "accuracy_task": acc.task if acc.accuracy is not None else None,
        "delta_pp": _pp(delta),
        "paired_p": None if pc is None else pc.mcnemar_p, "paired_n": None if pc is None else pc.n,
        "paired_delta_lo_pp": None if pc is None else _pp(pc.delta_ci_low),
        "paired_delta_hi_pp": None if pc is None else _pp(pc.delta_ci_high),
        "paired_significant": None if pc is None else not pc.within_noise,
        "paired_note": None if pc is not None or is_base else (paired_cell if paired_cell.startswith("n/a") else
                                                                 "no paired test: an accuracy is not measured"),
        "budget_verdict": None if budget is None else budget.get("verdict"),
        "budget_pp": None if budget is None else budget.get("budget_pp"),
        "budget_n": None if budget is None else budget.get("questions_used"),
        "budget_method": None if budget is None else budget.get("method"),
        "fallback": _flag(r.fallback.state), "fallback_kinds": r.fallback.kinds or None,
        "top1_agree": r.kl_top1_agree, "kl_mean": r.kl_mean,
        "kl_method": (r.kl_method or "teacher-forced") if (r.kl_mean is not None or r.kl_top1_agree is not None)
        else None,
        "kv_scales": r.kv_scale_source, "kv_scales_planned": r.kv_scale_planned,
        "latency_contended": lat, "sweep_contended": swp,
    }
    figs = (levels or {}).get(top or "", {})
    t = r.row.tags
    row.update({
        "sweep_level": top, "sweep_out_tps": figs.get("output_tps"), "sweep_out_tps_lo": figs.get("output_tps_ci_low"),
        "sweep_out_tps_hi": figs.get("output_tps_ci_high"), "sweep_achieved_rate": figs.get("achieved_rate"),
        "sweep_tpot_p95_ms": figs.get("tpot_ms_p95"), "goodput_rps": figs.get("goodput_rps"),
        "engine_kv_usage_max": figs.get("engine_kv_usage_max"), "engine_running_max": figs.get("engine_running_max"),
        "engine_waiting_max": figs.get("engine_waiting_max"), "prefix_hit_rate": figs.get("engine_prefix_hit_rate"),
        "sweep_dataset": t.get(Tag.SWEEP_DATASET) if levels else None,
        "slo_search": t.get(Tag.SLO_SEARCH) if levels else None,
        "slo_limit": r.metrics.get(SWEEP_SLO_LIMIT) if levels and t.get(Tag.SLO_SEARCH) else None,
        "slo_first_miss": t.get(Tag.SLO_SEARCH_FIRST_MISS) if levels and t.get(Tag.SLO_SEARCH) else None,
    })
    return row


def _cell(v: Any) -> Any:
    return "" if v is None else v  # floats as repr (full precision), flags as True / False


def render_csv(rows: list[dict[str, Any]]) -> str:
    """Header ``CSV_COLUMNS``, one line per arm (several GPUs: one ``gpu`` column, one header)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([k for k, _, _ in CSV_COLUMNS])
    for row in rows:
        w.writerow([_cell(row.get(k)) for k, _, _ in CSV_COLUMNS])
    return buf.getvalue()


__all__ = ["CSV_COLUMNS", "FLAGS", "NUMERIC", "machine_row", "render_csv"]
