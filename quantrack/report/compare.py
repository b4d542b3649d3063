"""The study table (the seeds' lab06 §4 template) built from tracked runs — pure, no mlflow here.

One row per arm (its newest finished run; a failed or rejected arm shows its newest run and status;
a footnote counts the runs of the same arm that were skipped, e.g. a Ray retry's KILLED partial run):
Configuration, Weights (GiB), Capacity (tok), Batch-1 TPOT, GSM8K, Δ vs <baseline>, plus predicted vs
reported capacity, the KV cache in MiB (llama.cpp's buffer), the derived cost per 1M output tokens at
the arm's highest measured sweep concurrency (quantrack.pricing), the paired test for Δ (exact McNemar
from per-question records), the fallback column, and top-1 agreement / KL. Any cell whose metric was not
logged reads ``FILL IN`` (cost: ``—``): nothing is ever filled from elsewhere. Which figures are measured
and which derived is in ``COLUMNS`` and in the footer.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.errors import BadInput, did_you_mean
from quantrack.run.schema import SWEEP_OUTPUT_TPS, Metric, Param, Tag
from quantrack.tracking import RunRow

if TYPE_CHECKING:
    from quantrack.pricing import PriceTable

FILL = "FILL IN"
BASELINE_CELL = "— (baseline)"
FORMATS = ("table", "md", "csv", "json")
NO_RECORDS = "n/a: no per-question records"

# Metric/tag names: one definition, shared with the writer (quantrack.run.schema; docs/tracking.md).
M_WEIGHTS = Metric.WEIGHTS_GIB
M_KV_REPORTED = Metric.KV_TOKENS_REPORTED
M_KV_PREDICTED = Metric.KV_TOKENS_PREDICTED
M_CAP_ERR = Metric.CAPACITY_ERROR_PCT
M_TPOT = Metric.TPOT_MS_P50
M_GSM8K = Metric.GSM8K_ACCURACY
M_GSM8K_SE = Metric.GSM8K_SE
M_GSM8K_N = Metric.GSM8K_N
M_GSM8K_LOW = Metric.GSM8K_CI_LOW  # 95% Wilson interval (quantrack.accuracy.stats.proportion)
M_GSM8K_HIGH = Metric.GSM8K_CI_HIGH
M_KV_MIB = Metric.KV_MIB_REPORTED  # llama.cpp: the KV buffer its log prints (K + V MiB)
SWEEP_TPS = SWEEP_OUTPUT_TPS  # measured output tok/s at concurrency N
M_SERVER_TPOT = Metric.SERVER_TPOT_MS  # llama.cpp: the server's own per-token time
M_TOP1 = Metric.KL_TOP1_AGREE
M_KL = Metric.KL_MEAN
T_CORRECT = Tag.GSM8K_CORRECT  # per-question outcomes: '1' right, '0' wrong, '.' not answered
T_DATA_SHA = Tag.GSM8K_DATA_SHA256
T_FALLBACK = Tag.FALLBACK
T_FALLBACK_KINDS = Tag.FALLBACK_KINDS
T_VERDICT = Tag.VERDICT
T_BASELINE = Tag.BASELINE
T_CONTENTION = Tag.CONTENTION  # yes / no / unknown (quantrack.measure.hygiene)
T_CONTENTION_REASONS = Tag.CONTENTION_REASONS
WIDTH = 120  # the default table fits this many columns; --wide shows every column

# (key, header, label): label says where the figure comes from.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("arm", "Arm", "run"),
    ("configuration", "Configuration", "run params: weights / KV-cache dtype"),
    ("weights_gib", "Weights (GiB)", "measured: engine startup log"),
    ("capacity_tok", "Capacity (tok)", "measured: engine startup log (KV-cache tokens)"),
    ("predicted_tok", "Predicted (tok)", "derived: quantrack.capacity"),
    ("capacity_error", "Cap. error", "derived: (reported - predicted) / predicted"),
    ("kv_mib", "KV (MiB)", "measured: engine startup log (llama.cpp KV buffer, K + V)"),
    ("tpot_ms", "Batch-1 TPOT", "measured: client, median over iterations"),
    ("cost", "{cost}", ("derived: dated GPU price per hour / measured output tok/s at the arm's highest sweep "
                        "concurrency")),
    ("gsm8k", "GSM8K", ("measured or imported: accuracy [95% Wilson interval] n=questions "
                        "(accuracy ± standard error where no interval was logged)")),
    ("delta", "Δ vs {baseline}", "derived: accuracy difference, percentage points"),
    ("paired_test", "Paired test", "derived: exact McNemar on per-question records"),
    ("fallback", "Fallback", "measured: engine startup log"),
    ("top1_agree", "Top-1 agree", "measured: KL fidelity run"),
    ("kl", "KL", "measured: KL fidelity run (mean nats/token)"),
    ("status", "Status", "run status"),
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
    columns: tuple[tuple[str, str, str], ...] = COLUMNS  # + LOAD_COLUMNS when an arm recorded them

    def headers(self) -> list[str]:
        return [h.format(baseline=self.baseline or "baseline", cost=self.cost_header) for _, h, _ in self.columns]


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


def skipped_runs(runs: list[RunRow], chosen: dict[str, RunRow]) -> dict[str, dict[str, int]]:
    """Per arm, the statuses of its runs that the table does not show (re-runs, retries' partial runs)."""
    out: dict[str, Counter[str]] = {}
    for r in runs:
        shown = chosen.get(r.arm)
        if shown is not None and r.run_id != shown.run_id:
            out.setdefault(r.arm, Counter())[r.status] += 1
    return {a: dict(sorted(c.items())) for a, c in out.items()}


def _skipped_note(skipped: dict[str, dict[str, int]], chosen: dict[str, RunRow]) -> str | None:
    if not skipped:
        return None
    parts = []
    for arm in sorted(skipped):
        counts = skipped[arm]
        n = sum(counts.values())
        what = ", ".join(f"{k} {v}" for k, v in counts.items())
        shown = "latest FINISHED" if chosen[arm].status == "FINISHED" else f"latest ({chosen[arm].status})"
        parts.append(f"{arm}: {shown} run shown, {n} other run{'s' if n != 1 else ''} skipped ({what})")
    return "several runs per arm: " + "; ".join(parts) + "."


def sweep_throughput(metrics: dict[str, float]) -> dict[int, float]:
    """Measured output tok/s per sweep concurrency level (``sweep_output_tps_c<N>``)."""
    out: dict[int, float] = {}
    for k, v in metrics.items():
        m = SWEEP_TPS.match(k)
        if m and isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
            out[int(m.group(1))] = float(v)
    return out


def _gpu_count(r: RunRow) -> int:
    try:
        return max(1, int(r.params.get(Param.TP) or 1))
    except ValueError:
        return 1


def cost_for(r: RunRow, prices: PriceTable) -> tuple[str, int | None, dict[str, Any] | None]:
    """The cost cell at the arm's highest measured sweep concurrency: (cell, N, figures) or ('—', None, None)."""
    from quantrack.pricing import NOT_PRICED, cost_cell

    tps = sweep_throughput(r.metrics)
    if not tps:
        return NOT_PRICED, None, None
    n = max(tps)
    gpus = [g for g in (r.params.get(Param.GPU_NAME), r.params.get(Param.GPU_CATALOG)) if g and g not in ("auto",)]
    for gpu in gpus:
        cell = cost_cell(gpu, tps, n, prices, gpu_count=_gpu_count(r))
        if cell != NOT_PRICED:
            return cell, n, {"usd_per_1m_output_tokens": float(cell), "concurrency": n,
                             "output_tok_s": tps[n], "gpu": gpu, "gpu_count": _gpu_count(r)}
    return NOT_PRICED, n, None


def _cost_header(ns: set[int]) -> str:
    from quantrack.pricing import cost_column

    if len(ns) == 1:
        return cost_column(next(iter(ns)))
    if not ns:
        return "$ / 1M out tok (derived)"
    return "$ / 1M out tok (derived, @cN: highest measured per arm)"


def _price_table(prices: PriceTable | str | Path | None) -> PriceTable:
    from quantrack.pricing import PriceTable, load_prices

    return prices if isinstance(prices, PriceTable) else load_prices(prices)


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


def gsm8k_cell(m: dict[str, float]) -> str:
    """Accuracy with its 95% Wilson interval and n when logged (an SE of 0 at 0/n or n/n says nothing);
    else accuracy ± SE; else FILL IN."""
    acc, se = m.get(M_GSM8K), m.get(M_GSM8K_SE)
    lo, hi, n = m.get(M_GSM8K_LOW), m.get(M_GSM8K_HIGH), m.get(M_GSM8K_N)
    if acc is None:
        return FILL
    if lo is not None and hi is not None:
        return f"{acc * 100:.1f}% [{lo * 100:.1f}, {hi * 100:.1f}]" + (f" n={round(n)}" if n is not None else "")
    if se is None:
        return f"{acc:.3f}"
    return f"{acc:.3f} ± {se:.3f}"


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
    w = r.params.get(Param.WEIGHTS)
    kv = r.params.get(Param.KV_CACHE_DTYPE_EFFECTIVE) or r.params.get(Param.KV_CACHE_DTYPE)
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


def contention(r: RunRow, step: str) -> tuple[str, str]:
    """(state, reasons) of a step's measurement hygiene: state yes / no / unknown ('unknown' when the run
    recorded none, e.g. runs logged before quantrack sampled the host)."""
    state = r.tags.get(T_CONTENTION.format(step=step)) or "unknown"
    return state, r.tags.get(T_CONTENTION_REASONS.format(step=step)) or ""


def _tpot_cell(m: dict[str, float], r: RunRow) -> str:
    """Client TPOT (and the server's own per-token time where the engine reports it), ⚠ if contended."""
    if m.get(M_TPOT) is None:
        return FILL
    cell = f"{m[M_TPOT]:.2f}"
    if m.get(M_SERVER_TPOT) is not None:
        cell += f" / {m[M_SERVER_TPOT]:.2f}"
    return cell + (" ⚠" if contention(r, "latency")[0] == "yes" else "")


def _narrow_gsm8k(m: dict[str, float]) -> str:
    acc, lo, hi = m.get(M_GSM8K), m.get(M_GSM8K_LOW), m.get(M_GSM8K_HIGH)
    if acc is None:
        return FILL
    if lo is None or hi is None:
        return gsm8k_cell(m)
    d = 1 if hi - lo < 0.10 else 0  # a narrow interval (large n) keeps a decimal: [1–3] would hide it
    return f"{acc * 100:.1f}% [{lo * 100:.{d}f}–{hi * 100:.{d}f}]"


def _capacity_cell(m: dict[str, float]) -> str:
    # llama.cpp logs both: its token figure is the context it was given (-c), the same for every arm; the
    # buffer in MiB is what the KV dtype changes, so it is the capacity figure shown
    if m.get(M_KV_MIB) is not None:
        return f"{m[M_KV_MIB]:,.2f} MiB"
    if m.get(M_KV_REPORTED) is not None:
        return f"{round(m[M_KV_REPORTED]):,}"
    return FILL


def build_table(experiment: str, runs: list[RunRow], baseline: str | None = None,
                prices: PriceTable | str | Path | None = None) -> CompareTable:
    """Rows for every arm of the experiment, in the order the arms were first run.

    ``prices``: a PriceTable or a prices TOML (``--prices FILE``); None: the shipped rules/prices.toml."""
    price_table = _price_table(prices)
    chosen = pick_arm_runs(runs)
    base_name = choose_baseline(chosen, baseline)
    base = chosen.get(base_name) if base_name else None
    first_seen: dict[str, int] = {}
    for r in runs:
        first_seen[r.arm] = min(first_seen.get(r.arm, r.start_time), r.start_time)
    order = sorted(chosen, key=lambda a: (a != base_name, first_seen[a], a))
    table = CompareTable(experiment=experiment, baseline=base_name, rows=[],
                         skipped=skipped_runs(runs, chosen))
    base_acc = base.metrics.get(M_GSM8K) if base else None
    costs = {arm: cost_for(chosen[arm], price_table) for arm in order}
    cost_ns = {n for _, n, _ in costs.values() if n is not None}
    table.cost_header = _cost_header(cost_ns)
    for arm in order:
        r = chosen[arm]
        m = r.metrics
        acc = m.get(M_GSM8K)
        gsm = gsm8k_cell(m)
        cost, cost_n, cost_info = costs[arm]
        if len(cost_ns) > 1 and cost_n is not None and cost_info is not None:
            cost = f"{cost} @c{cost_n}"
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
            "kv_mib": _num(m.get(M_KV_MIB)),
            "tpot_ms": FILL if m.get(M_TPOT) is None else f"{m[M_TPOT]:.2f} ms",
            "cost": cost,
            "gsm8k": gsm,
            "delta": delta,
            "paired_test": test,
            "fallback": _fallback(r),
            # the baseline's own fidelity is not "not measured": it is what the others are scored against
            "top1_agree": (BASELINE_CELL if arm == base_name else FILL) if m.get(M_TOP1) is None
            else f"{m[M_TOP1] * 100:.1f}%",
            "kl": (BASELINE_CELL if arm == base_name else FILL) if m.get(M_KL) is None else f"{m[M_KL]:.4f}",
            "status": _status(r),
        }
        load = load_cells(r)
        if load is not None:
            row.update(load[0])
        table.rows.append(row)
        is_base = arm == base_name
        p = (test_info or {}).get("mcnemar_p")
        measured_fid = m.get(M_TOP1) is not None or m.get(M_KL) is not None
        if not measured_fid:
            fid = BASELINE_CELL if is_base else FILL
        else:  # the baseline's own figures are a self-check (it is scored against a second copy of itself)
            fid = f"{row['top1_agree']} / {row['kl']}" + (" (self)" if is_base else "")
        table.narrow.append({
            "arm": arm, "configuration": row["configuration"].replace(" KV", ""), "weights_gib": row["weights_gib"],
            "capacity": _capacity_cell(m), "tpot": _tpot_cell(m, r), "gsm8k": _narrow_gsm8k(m),
            "delta": delta if p is None else f"{delta} (p={p:.2g})", "fidelity": fid, "fallback": row["fallback"],
            "cost": cost, "status": row["status"],
        })
        table.raw.append({
            "arm": arm, "run_id": r.run_id, "status": r.status, "verdict": r.tags.get(T_VERDICT),
            "weights": r.params.get(Param.WEIGHTS), "kv_cache_dtype": r.params.get(Param.KV_CACHE_DTYPE),
            "metrics": {k: m.get(k) for k in (M_WEIGHTS, M_KV_REPORTED, M_KV_PREDICTED, M_CAP_ERR, M_KV_MIB, M_TPOT,
                                              M_GSM8K, M_GSM8K_SE, M_GSM8K_LOW, M_GSM8K_HIGH, M_GSM8K_N, M_TOP1,
                                              M_KL)},
            "cost": cost_info,
            "skipped_runs": table.skipped.get(arm, {}),
            "delta_vs_baseline": None if arm == base_name or acc is None or base_acc is None else acc - base_acc,
            "paired_test": test_info,
            "fallback": r.tags.get(T_FALLBACK), "fallback_kinds": r.tags.get(T_FALLBACK_KINDS),
            "contention": {step: dict(zip(("state", "reasons"), contention(r, step))) for step in ("latency", "sweep")},
        })
        if load is not None:
            table.raw[-1]["sweep_levels"] = load[1]
    _add_load_columns(table)
    if base_name is None and chosen:
        table.notes.append("no baseline: pass --baseline ARM (no arm is named bf16 or tagged as baseline)")
    table.notes.append("measured: weights, capacity and KV MiB (engine log), TPOT (client), GSM8K (eval), fallback "
                       "(log); derived: predicted capacity, capacity error, cost, Δ, paired test. "
                       "GSM8K: accuracy [95% Wilson interval] n=questions. "
                       "* = Δ's 95% interval excludes 0. FILL IN = not measured.")
    priced = [arm for arm in order if costs[arm][2] is not None]
    if priced:
        from quantrack.pricing import price_summary

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
    table.notes.extend(_contention_notes(order, chosen))
    quick = [a for a in order if chosen[a].tags.get(Tag.QUICK) == "true"]
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


def load_cells(r: RunRow) -> tuple[dict[str, str], dict[str, dict[str, float]]] | None:
    """The load columns of one arm (None when its sweep recorded none of the load figures)."""
    from quantrack.run.schema import SWEEP_SLO_LIMIT

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
        slo = (f"{unit}{lim:g}" if lim is not None else "none") + f" ({crit}; first miss " \
            f"{(unit + miss) if miss and miss != 'none' else 'none'})"
    else:
        slo = "— (no slo_search)"
    return ({"sweep_level": top_cell, "sweep_tps": cell, "sweep_tpot_p95": num("tpot_ms_p95"),
             "goodput": num("goodput_rps", 3) if figs.get("goodput_rps") is not None else "— (no goodput SLO)",
             "engine_view": engine, "slo_limit": slo}, levels)


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


def _contention_notes(order: list[str], chosen: dict[str, RunRow]) -> list[str]:
    """One note per step whose figures were taken under contention, naming the arms and why; and one for
    the arms whose runs recorded no hygiene at all (their latency may or may not have been contended)."""
    notes = []
    for step in ("latency", "sweep"):
        hit = [(a, contention(chosen[a], step)[1]) for a in order if contention(chosen[a], step)[0] == "yes"]
        if hit:
            notes.append(f"⚠ {step} figures taken under contention (not a property of the arm): "
                         + "; ".join(f"{a}: {why}" for a, why in hit) + ".")
    unknown = [a for a in order if chosen[a].metrics.get(M_TPOT) is not None
               and contention(chosen[a], "latency")[0] == "unknown"]
    if unknown:
        notes.append("host contention during latency not recorded for: " + ", ".join(unknown) + ".")
    return notes


# The default table: the decision columns, merged so that it fits WIDTH columns; --wide gives COLUMNS.
NARROW: tuple[tuple[str, str], ...] = (
    ("arm", "Arm"), ("configuration", "Weights / KV"), ("weights_gib", "Wt GiB"), ("capacity", "KV {kvunit}"),
    ("tpot", "TPOT ms{srv}"), ("gsm8k", "GSM8K [95% CI]"), ("delta", "Δ vs {baseline}"),
    ("fidelity", "Top-1 / KL"), ("fallback", "Fallback"), ("cost", "{cost}"), ("status", "Status"),
)
# Columns the default table leaves out when every row holds the same uninformative value (a note says so).
_DROPPABLE = {"cost": ("—",), "status": ("finished",), "fallback": ("no",)}
_DROP_NOTE = {"cost": "", "status": "every arm finished", "fallback": "no fallback in any log"}


def render_narrow(table: CompareTable, width: int = WIDTH) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    srv = " (client / server)" if any(" / " in r["tpot"] for r in table.narrow) else ""
    caps = {r["capacity"] for r in table.narrow} - {FILL}
    kvunit = "MiB" if caps and all(c.endswith(" MiB") for c in caps) else (
        "tokens" if caps and not any(c.endswith(" MiB") for c in caps) else "(tokens | MiB)")
    rows = [dict(r, capacity=r["capacity"].removesuffix(" MiB")) for r in table.narrow] if kvunit == "MiB" \
        else table.narrow
    cols = [(k, h.format(baseline=table.baseline or "baseline", cost="$ / 1M tok", srv=srv, kvunit=kvunit))
            for k, h in NARROW]
    dropped = []
    for key, same in _DROPPABLE.items():
        if rows and all(r[key] in same for r in rows):
            cols = [c for c in cols if c[0] != key]
            dropped.append(_DROP_NOTE[key])
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
    legend = ("measured: weights, KV capacity (engine log), TPOT (client; server's own where shown), GSM8K, "
              "top-1/KL; derived: Δ (paired exact McNemar p), cost. FILL IN = not measured. "
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


def compare_experiment(experiment: str, baseline: str | None = None, uri: str | None = None,
                       prices: str | Path | None = None) -> CompareTable:
    """Read the experiment's arm runs (one search) and build the table (``prices``: ``--prices FILE``)."""
    from quantrack.tracking import load_runs

    price_table = _price_table(prices)  # a bad prices file is reported before the store is read
    runs = load_runs(experiment, uri)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    return build_table(experiment, runs, baseline, price_table)


def run_gpu(r: RunRow) -> str:
    """The GPU a run measured on: NVML's name (or the fleet job's GPU type), else the study's catalog GPU."""
    return r.params.get(Param.GPU_NAME) or r.params.get(Param.GPU_CATALOG) or "unknown GPU"


def compare_by_gpu(experiment: str, baseline: str | None = None, uri: str | None = None,
                   prices: str | Path | None = None, gpu: str | None = None) -> list[CompareTable]:
    """One table per GPU in the experiment (a fleet study runs the same arms on several GPU types: each GPU's
    arms are compared against that GPU's baseline); a single-GPU experiment gives the one usual table.
    ``gpu`` keeps only that GPU's runs (matched case-insensitively against the names the runs logged)."""
    from quantrack.tracking import load_runs

    price_table = _price_table(prices)
    runs = load_runs(experiment, uri)
    if not runs:
        raise BadInput(f"experiment {experiment!r} has no arm runs (log some with `quantrack run` or `quantrack log`)")
    groups: dict[str, list[RunRow]] = {}
    for r in runs:
        groups.setdefault(run_gpu(r), []).append(r)
    if gpu is not None:
        match = [g for g in groups if g.lower() == gpu.lower()]
        if not match:
            raise BadInput(f"no runs on GPU {gpu!r} in experiment {experiment!r}{did_you_mean(gpu, groups)}; "
                           f"GPUs: {', '.join(sorted(groups))}")
        groups = {match[0]: groups[match[0]]}
    if len(groups) == 1:
        return [build_table(experiment, next(iter(groups.values())), baseline, price_table)]
    return [build_table(f"{experiment} @ {g}", rs, baseline, price_table) for g, rs in sorted(groups.items())]


def render_many(tables: list[CompareTable], fmt: str = "table", wide: bool = False) -> str:
    """Render one or several tables (JSON: the single table's object, or {"tables": [...]} for several)."""
    if len(tables) == 1:
        return render(tables[0], fmt, wide)
    if fmt == "json":
        return json.dumps({"tables": [json.loads(render(t, "json")) for t in tables]}, indent=2,
                          ensure_ascii=False) + "\n"
    return "\n".join(render(t, fmt, wide) for t in tables)


__all__ = ["FILL", "FORMATS", "CompareTable", "build_table", "compare_by_gpu", "compare_experiment", "cost_for",
           "gsm8k_cell", "paired_test", "render", "render_many", "run_gpu", "skipped_runs", "sweep_throughput"]
