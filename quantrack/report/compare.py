"""The study table (the seeds' lab06 §4 template) built from tracked runs — pure, no mlflow here.

One row per arm (its newest finished run; a failed or rejected arm shows its newest run and status):
Configuration, Weights (GiB), Capacity (tok), Batch-1 TPOT, GSM8K, Δ vs <baseline>, plus predicted vs
reported capacity, the paired test for Δ (exact McNemar from per-question records), the fallback
column, and top-1 agreement / KL. Any cell whose metric was not logged reads ``FILL IN``: nothing is ever
filled from elsewhere. Which figures are measured and which derived is in ``COLUMNS`` and in the footer.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.tracking import RunRow

FILL = "FILL IN"
FORMATS = ("table", "md", "csv", "json")
NO_RECORDS = "n/a: no per-question records"

# Metric/tag names: fixed, documented in docs/tracking.md.
M_WEIGHTS = "weights_gib"
M_KV_REPORTED = "kv_tokens_reported"
M_KV_PREDICTED = "kv_tokens_predicted"
M_CAP_ERR = "capacity_error_pct"
M_TPOT = "tpot_ms_p50"
M_GSM8K = "gsm8k_accuracy"
M_GSM8K_SE = "gsm8k_se"
M_GSM8K_N = "gsm8k_n"
M_TOP1 = "kl_top1_agree"
M_KL = "kl_mean"
T_CORRECT = "quantrack.gsm8k_correct"  # per-question outcomes: '1' right, '0' wrong, '.' not answered
T_DATA_SHA = "quantrack.gsm8k_data_sha256"
T_FALLBACK = "quantrack.fallback"
T_FALLBACK_KINDS = "quantrack.fallback_kinds"
T_VERDICT = "quantrack.verdict"
T_BASELINE = "quantrack.baseline"

# (key, header, label): label says where the figure comes from.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("arm", "Arm", "run"),
    ("configuration", "Configuration", "run params: weights / KV-cache dtype"),
    ("weights_gib", "Weights (GiB)", "measured: engine startup log"),
    ("capacity_tok", "Capacity (tok)", "measured: engine startup log (KV-cache tokens)"),
    ("predicted_tok", "Predicted (tok)", "derived: quantrack.capacity"),
    ("capacity_error", "Cap. error", "derived: (reported - predicted) / predicted"),
    ("tpot_ms", "Batch-1 TPOT", "measured: client, median over iterations"),
    ("gsm8k", "GSM8K", "measured or imported: accuracy ± standard error"),
    ("delta", "Δ vs {baseline}", "derived: accuracy difference, percentage points"),
    ("paired_test", "Paired test", "derived: exact McNemar on per-question records"),
    ("fallback", "Fallback", "measured: engine startup log"),
    ("top1_agree", "Top-1 agree", "measured: KL fidelity run"),
    ("kl", "KL", "measured: KL fidelity run (mean nats/token)"),
    ("status", "Status", "run status"),
)


@dataclass
class CompareTable:
    experiment: str
    baseline: str | None
    rows: list[dict[str, str]]
    raw: list[dict[str, Any]] = field(default_factory=list)  # the numbers behind each row (json)
    notes: list[str] = field(default_factory=list)

    def headers(self) -> list[str]:
        return [h.format(baseline=self.baseline or "baseline") for _, h, _ in COLUMNS]


def pick_arm_runs(runs: list[RunRow]) -> dict[str, RunRow]:
    """Newest FINISHED run per arm; an arm with none keeps its newest run of any status."""
    best: dict[str, RunRow] = {}
    for r in runs:
        cur = best.get(r.arm)
        if cur is None:
            best[r.arm] = r
            continue
        r_ok, cur_ok = r.status == "FINISHED", cur.status == "FINISHED"
        if (r_ok, r.start_time) > (cur_ok, cur.start_time):
            best[r.arm] = r
    return best


def choose_baseline(chosen: dict[str, RunRow], baseline: str | None) -> str | None:
    if not chosen:
        return None
    if baseline is not None:
        if baseline not in chosen:
            raise BadInput(f"--baseline {baseline!r} is not an arm of this experiment"
                           f"{did_you_mean(baseline, chosen)}; arms: {', '.join(sorted(chosen))}")
        return baseline
    flagged = [a for a, r in chosen.items() if r.tags.get(T_BASELINE) == "true"]
    if flagged:
        return max(flagged, key=lambda a: chosen[a].start_time)
    return "bf16" if "bf16" in chosen else None


def _num(x: float | None, digits: int = 2) -> str:
    return FILL if x is None else f"{x:,.{digits}f}"


def _int(x: float | None) -> str:
    return FILL if x is None else f"{round(x):,}"


def _outcomes(row: RunRow) -> str | None:
    s = row.tags.get(T_CORRECT)
    return s if s and set(s) <= {"0", "1", "."} else None


def paired_test(base: RunRow, arm: RunRow) -> tuple[str, dict[str, Any] | None]:
    """Exact McNemar on the questions both runs answered, from their per-question records."""
    sb, sa = _outcomes(base), _outcomes(arm)
    if sb is None or sa is None:
        return NO_RECORDS, None
    db, da = base.tags.get(T_DATA_SHA), arm.tags.get(T_DATA_SHA)
    if db and da and db != da:
        return "n/a: different question sets", None
    a = b = c = d = 0
    for x, y in zip(sb, sa):
        if x == "." or y == ".":
            continue
        if x == "1" and y == "1":
            a += 1
        elif x == "1":
            b += 1
        elif y == "1":
            c += 1
        else:
            d += 1
    if a + b + c + d == 0:
        return "n/a: no question answered by both", None
    from quantrack.accuracy.stats import compare_counts

    pc = compare_counts(a, b, c, d)
    info = {"n": pc.n, "base_only": pc.base_only, "arm_only": pc.arm_only, "mcnemar_p": pc.mcnemar_p,
            "delta_paired": pc.delta, "delta_ci_low": pc.delta_ci_low, "delta_ci_high": pc.delta_ci_high}
    mark = "" if pc.within_noise else " *"
    return f"McNemar p={pc.mcnemar_p:.3g} (n={pc.n}){mark}", info


def _configuration(r: RunRow) -> str:
    w = r.params.get("weights")
    kv = r.params.get("kv_cache_dtype_effective") or r.params.get("kv_cache_dtype")
    if not w and not kv:
        return FILL
    return f"{w or FILL} / {kv or FILL} KV"


def _fallback(r: RunRow) -> str:
    fb = r.tags.get(T_FALLBACK)
    if fb is None:
        return FILL
    if fb == "yes":
        kinds = r.tags.get(T_FALLBACK_KINDS)
        return f"yes ({kinds})" if kinds else "yes"
    return fb


def _status(r: RunRow) -> str:
    if r.tags.get(T_VERDICT) == "reject":
        return "rejected"
    return r.status.lower() if r.status == "FINISHED" else r.status


def build_table(experiment: str, runs: list[RunRow], baseline: str | None = None) -> CompareTable:
    """Rows for every arm of the experiment, in the order the arms were first run."""
    chosen = pick_arm_runs(runs)
    base_name = choose_baseline(chosen, baseline)
    base = chosen.get(base_name) if base_name else None
    first_seen: dict[str, int] = {}
    for r in runs:
        first_seen[r.arm] = min(first_seen.get(r.arm, r.start_time), r.start_time)
    order = sorted(chosen, key=lambda a: (a != base_name, first_seen[a], a))
    table = CompareTable(experiment=experiment, baseline=base_name, rows=[])
    base_acc = base.metrics.get(M_GSM8K) if base else None
    for arm in order:
        r = chosen[arm]
        m = r.metrics
        acc, se = m.get(M_GSM8K), m.get(M_GSM8K_SE)
        if acc is None:
            gsm = FILL
        elif se is None:
            gsm = f"{acc:.3f}"
        else:
            gsm = f"{acc:.3f} ± {se:.3f}"
        test_info: dict[str, Any] | None = None
        if arm == base_name:
            delta = "— (baseline)"
            test = "—"
        elif base is None:
            delta, test = "n/a: no baseline", "n/a: no baseline"
        else:
            delta = FILL if acc is None or base_acc is None else f"{(acc - base_acc) * 100:+.1f} pts"
            test, test_info = paired_test(base, r) if acc is not None and base_acc is not None else (FILL, None)
        cap_err = m.get(M_CAP_ERR)
        row = {
            "arm": arm,
            "configuration": _configuration(r),
            "weights_gib": _num(m.get(M_WEIGHTS)),
            "capacity_tok": _int(m.get(M_KV_REPORTED)),
            "predicted_tok": _int(m.get(M_KV_PREDICTED)),
            "capacity_error": FILL if cap_err is None else f"{cap_err:+.2f}%",
            "tpot_ms": FILL if m.get(M_TPOT) is None else f"{m[M_TPOT]:.2f} ms",
            "gsm8k": gsm,
            "delta": delta,
            "paired_test": test,
            "fallback": _fallback(r),
            "top1_agree": FILL if m.get(M_TOP1) is None else f"{m[M_TOP1] * 100:.1f}%",
            "kl": FILL if m.get(M_KL) is None else f"{m[M_KL]:.4f}",
            "status": _status(r),
        }
        table.rows.append(row)
        table.raw.append({
            "arm": arm, "run_id": r.run_id, "status": r.status, "verdict": r.tags.get(T_VERDICT),
            "weights": r.params.get("weights"), "kv_cache_dtype": r.params.get("kv_cache_dtype"),
            "metrics": {k: m.get(k) for k in (M_WEIGHTS, M_KV_REPORTED, M_KV_PREDICTED, M_CAP_ERR, M_TPOT,
                                              M_GSM8K, M_GSM8K_SE, M_GSM8K_N, M_TOP1, M_KL)},
            "delta_vs_baseline": None if arm == base_name or acc is None or base_acc is None else acc - base_acc,
            "paired_test": test_info,
            "fallback": r.tags.get(T_FALLBACK), "fallback_kinds": r.tags.get(T_FALLBACK_KINDS),
        })
    if base_name is None and chosen:
        table.notes.append("no baseline: pass --baseline ARM (no arm is named bf16 or tagged as baseline)")
    table.notes.append("measured: weights, capacity (engine log), TPOT (client), GSM8K (eval), fallback (log); "
                       "derived: predicted capacity, capacity error, Δ, paired test. "
                       "* = Δ's 95% interval excludes 0. FILL IN = not measured.")
    return table


def render(table: CompareTable, fmt: str = "table") -> str:
    if fmt not in FORMATS:
        raise BadInput(f"unknown --format {fmt!r}{did_you_mean(fmt, FORMATS)}; formats: {', '.join(FORMATS)}")
    headers = table.headers()
    keys = [k for k, _, _ in COLUMNS]
    body = [[row[k] for k in keys] for row in table.rows]
    if fmt == "json":
        return json.dumps({
            "experiment": table.experiment, "baseline": table.baseline,
            "columns": [{"key": k, "header": h.format(baseline=table.baseline or "baseline"), "source": s}
                        for k, h, s in COLUMNS],
            "rows": table.rows, "values": table.raw, "fill_in": FILL,
        }, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(headers)
        w.writerows(body)
        return buf.getvalue()
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


def compare_experiment(experiment: str, baseline: str | None = None, uri: str | None = None) -> CompareTable:
    """Read the experiment's arm runs (one search) and build the table."""
    from quantrack.tracking import load_runs

    runs = load_runs(experiment, uri)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    return build_table(experiment, runs, baseline)


__all__ = ["FILL", "FORMATS", "CompareTable", "build_table", "compare_experiment", "paired_test", "render"]
