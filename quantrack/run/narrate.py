"""Progress narration: one line per step result, what was measured and what was derived, on the
progress callback (the CLI prints it to stderr)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantrack.arms import Arm
from quantrack.run.outcome import ArmOutcome, Progress
from quantrack.run.record import kv_figures, number_of
from quantrack.run.schema import Metric

if TYPE_CHECKING:
    from quantrack.accuracy.gsm8k import EvalResult
    from quantrack.engines.base import LogReport
    from quantrack.measure.latency import LatencyResult
    from quantrack.measure.sweep import SweepResult


def say_capacity(say: Progress, arm: Arm, out: ArmOutcome) -> None:
    rep, figs = out.log_report, kv_figures(out)
    reported = rep.kv_cache_tokens if rep is not None else None
    predicted = number_of(out.predicted, "engine_tokens") if out.predicted is not None else None
    parts = []
    if predicted is not None or reported is not None:
        parts.append(f"KV tokens predicted {_fmt_int(predicted)} (derived) vs reported {_fmt_int(reported)} (log)")
    if Metric.KV_MIB_PREDICTED in figs or Metric.KV_MIB_REPORTED in figs:
        parts.append(f"KV MiB predicted {figs.get(Metric.KV_MIB_PREDICTED, 'n/a')} vs reported "
                     f"{figs.get(Metric.KV_MIB_REPORTED, 'n/a')}")
    if predicted and reported is not None:
        parts.append(f"capacity error {(reported - predicted) / predicted * 100:+.2f}%")
    if parts:
        say(f"[{arm.name}] capacity: {'; '.join(parts)}")


def _fmt_int(x: float | None) -> str:
    return "n/a" if x is None else f"{round(x):,}"


def took(seconds: float | None) -> str:
    return "" if seconds is None else f" [{seconds:.0f} s]"


def say_latency(say: Progress, arm: Arm, lat: LatencyResult, seconds: float | None = None) -> None:
    st = lat.stats()
    tpot, srv, ttft = st.get("tpot_ms"), st.get("server_tpot_ms"), st.get("ttft_ms")
    if tpot is None:
        say(f"[{arm.name}] latency: no successful sample")
        return
    line = f"[{arm.name}] latency: TPOT median {tpot.median:.2f} ms (client)"
    if srv is not None:
        diff = lat.tpot_vs_server_median_pct()
        from quantrack.engines import get_adapter

        timing = get_adapter(lat.engine).server_timing
        line += f", server {srv.median:.2f} ms" + (f" ({timing.split('.', 1)[0]} timings)" if timing else "")
        if diff is not None:
            line += f", difference {diff:+.2f}%"
    if ttft is not None:
        line += f"; TTFT median {ttft.median:.1f} ms"
    say(line + f" (n={len(lat.ok_samples)}){took(seconds)}")


def say_sweep(say: Progress, arm: Arm, sweep: SweepResult, seconds: float | None = None) -> None:
    from quantrack.measure.sweep import level_label

    cells = []
    for r in sweep.rows:
        tps = r.get("output_tok_s")
        what = level_label(r) + (f" (achieved {r['achieved_rate']:.2f}/s)"
                                 if isinstance(r.get("achieved_rate"), (int, float)) else "")
        cells.append(f"{what}: {tps:.1f} tok/s" if isinstance(tps, (int, float)) else f"{what}: n/a")
    if cells:
        say(f"[{arm.name}] sweep: output throughput {', '.join(cells)} (measured){took(seconds)}")
    s = sweep.slo_search
    if s and s.get("method") == "probe":
        from quantrack.measure.search import bracket_text

        say(f"[{arm.name}] SLO search {s['criterion']} (measured probes, {s['n_probes']} of at most "
            f"{s['probe_bound']}, x{s['repeats']} each): bracket {bracket_text(s)}; stopped: {s['stop_text']}")
    elif s:
        say(f"[{arm.name}] SLO search {s['criterion']}: highest measured {s['mode']} meeting it "
            f"{s['limit'] if s['limit'] is not None else 'none'}"
            + (f", first miss {s['first_miss']}" if s.get("first_miss") is not None else " (no level missed)"))


def say_eval(say: Progress, arm: Arm, ev: EvalResult, seconds: float | None = None) -> None:
    acc, n, lo, hi = ev.accuracy, ev.n, ev.ci_low, ev.ci_high
    if acc is None:
        say(f"[{arm.name}] eval: no question answered")
        return
    ci = f", 95% interval {lo * 100:.0f}-{hi * 100:.0f}%" if lo is not None and hi is not None else ""
    task = ev.task or "gsm8k"
    label = "GSM8K" if task.startswith("gsm8k") else task
    wide = lo is None or hi is None or hi - lo > 0.05  # wider than 5 points: the interval is the result
    note = "measured; a small sample: the interval, not the point, is the result" if wide else "measured"
    say(f"[{arm.name}] eval: {label} {acc * 100:.0f}% of {int(n or 0):,} questions{ci} ({note}){took(seconds)}")


def say_log(say: Progress, arm: Arm, rep: LogReport | None) -> None:
    if rep is None:
        return
    parts = []
    if rep.weights_gib is not None:
        parts.append(f"weights {rep.weights_gib} GiB")
    extra = rep.extra or {}
    if extra.get("file_type"):
        parts.insert(0, f"file type {extra['file_type']}")
    if rep.kv_cache_tokens is not None:
        parts.append(f"KV {rep.kv_cache_tokens:,} tokens")
    if extra.get("kv_mib") is not None:
        parts.append(f"KV {extra['kv_mib']} MiB (K {extra.get('k_type')} {extra.get('k_mib')} MiB, "
                     f"V {extra.get('v_type')} {extra.get('v_mib')} MiB)")
    if rep.attention_backend:
        parts.append(f"attention {rep.attention_backend}")
    if rep.fallbacks:
        parts.append("FALLBACK: " + ", ".join(e.kind for e in rep.fallbacks))
    say(f"[{arm.name}] log: {'; '.join(parts) or 'no figures found'}")
