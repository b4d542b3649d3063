"""The decision report's pictures (matplotlib, Agg, imported only here): one PNG per question, as bytes.

Each function takes a ``decision.Section`` and returns ``(name, title, caption, png)`` or None when there is
nothing measured to draw (the page then says so). Every drawn value is a measured or derived figure of the
section; nothing is interpolated between measured levels (lines join measured points only, markers show them).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantrack.constraints import Constraints
    from quantrack.report.recommend import Section

Picture = tuple[str, str, str, bytes]
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def quiet_matplotlib() -> None:
    """Before matplotlib's first import: its config and font cache go to quantrack's cache folder
    (``$QUANTRACK_CACHE`` or ``~/.cache/quantrack``, ``matplotlib/``), else a folder of this user's in the temporary
    folder, unless ``MPLCONFIGDIR`` is set. An unwritable ``~/.config`` made matplotlib print two lines of warnings
    on stderr at every command that draws (and rebuild its font cache each time)."""
    import os
    import sys
    import tempfile
    from pathlib import Path

    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return
    env = os.environ.get("QUANTRACK_CACHE")
    choices = [Path(env).expanduser() if env else Path.home() / ".cache" / "quantrack"]
    choices.append(Path(tempfile.gettempdir()) / f"quantrack-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
    for base in choices:
        d = base / "matplotlib"
        try:
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            st = d.stat()
        except OSError:
            continue
        if os.access(d, os.W_OK | os.X_OK) and (not hasattr(os, "getuid") or st.st_uid == os.getuid()):
            os.environ["MPLCONFIGDIR"] = str(d)
            return


def _subplots(figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A figure outside pyplot (no global state, and pyplot's import is skipped); PNG through the Agg canvas."""
    quiet_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots()


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _thousands() -> Any:
    quiet_matplotlib()
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:,.0f}")


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def capacity(sec: Section) -> Picture | None:
    arms = [a for a in sec.arms if a.capacity.value is not None]
    if not arms:
        return None
    fig, ax = _subplots((7.0, 3.4))
    names = [a.arm for a in arms]
    vals = [a.capacity.value or 0.0 for a in arms]
    bars = ax.bar(names, vals, color=[_color(i) for i in range(len(arms))])
    for b, a in zip(bars, arms):
        label = a.capacity_x.show() if a.capacity_x.known else ""
        ax.annotate(f"{a.capacity.value:,.0f}\n{label}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    pred = [(i, a.predicted.value) for i, a in enumerate(arms) if a.predicted.value is not None]
    if pred:
        ax.scatter([i for i, _ in pred], [v for _, v in pred], marker="_", s=600, color="black", zorder=3,
                   label="predicted (derived)")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_ylabel("KV-cache tokens (engine log)")
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_ylim(0, max(vals) * 1.25)
    ax.set_title("Capacity per arm (measured; × vs baseline derived)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return ("capacity", "Capacity per arm",
            ("KV-cache tokens the engine reported at startup (measured), the capacity model's prediction (derived, "
            "black tick) and the ratio to the baseline (derived)."), _png(fig))


def _series(sec: Section, key: str) -> list[tuple[int, str, list[int], list[float]]]:
    out = []
    for i, a in enumerate(sec.arms):
        pts = sorted((c, f[key].value) for c, f in a.levels.items() if key in f and f[key].value is not None)
        if pts:
            out.append((i, a.arm, [c for c, _ in pts], [float(v) for _, v in pts if v is not None]))
    return out


def latency(sec: Section, c: Constraints, metric: str, stat: str) -> Picture | None:
    key = f"{metric}_{stat}"
    series = _series(sec, key)
    if not series:
        return None
    fig, ax = _subplots((7.0, 3.6))
    for i, arm, xs, ys in series:
        ax.plot(xs, ys, marker="o", color=_color(i), label=arm)
    levels = sorted({x for _, _, xs, _ in series for x in xs})
    for s in c.slos:
        if s.name == key:
            ax.axhline(s.limit_ms, color="red", linestyle="--", linewidth=1)
            ax.axvline(s.concurrency, color="red", linestyle=":", linewidth=0.8)
            ax.annotate(f"SLO {s.limit_ms:g} ms @ c{s.concurrency}", (levels[0], s.limit_ms), color="red",
                        fontsize=8, va="bottom")
    _log_x(ax, levels)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(f"{metric.upper()} {stat} (ms)")
    ax.set_title(f"{metric.upper()} {stat} against concurrency (measured sweep)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return (f"{key}-vs-concurrency", f"{metric.upper()} {stat} against concurrency",
            (f"{metric.upper()} {stat} per measured sweep level (measured), the SLO limit (red dashed) and the SLO's "
            "concurrency (red dotted)."), _png(fig))


def _log_x(ax: Any, levels: list[int]) -> None:
    if len(levels) > 1 and max(levels) / max(1, min(levels)) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(levels, labels=[str(x) for x in levels])


def throughput(sec: Section, c: Constraints) -> Picture | None:
    series = _series(sec, "throughput")
    if not series:
        return None
    fig, ax = _subplots((7.0, 3.6))
    for i, arm, xs, ys in series:
        ax.plot(xs, ys, marker="o", color=_color(i), label=arm)
        a = sec.arms[i]
        if a.slo_level is not None and a.throughput.value is not None and c.slos:
            ax.scatter([a.slo_level], [a.throughput.value], s=140, facecolors="none", edgecolors=_color(i),
                       linewidths=2, zorder=3)
    levels = sorted({x for _, _, xs, _ in series for x in xs})
    for s in c.slos:
        ax.axvline(s.concurrency, color="red", linestyle=":", linewidth=0.8)
    _log_x(ax, levels)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens / s")
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_title("Output throughput against concurrency (measured)" + ("; ring: goodput level" if c.slos else ""),
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ("throughput-vs-concurrency", "Throughput against concurrency",
            ("Output tokens per second over each sweep level's wall time (measured); a ring marks each arm's "
            "goodput level (the highest measured concurrency meeting every SLO); red dotted: the SLOs' concurrency."),
            _png(fig))


def speedup(sec: Section) -> Picture | None:
    base = next((a for a in sec.arms if a.baseline), None)
    if base is None:
        return None
    bt = {c: f["throughput"].value for c, f in base.levels.items() if "throughput" in f}
    lines = []
    for i, a in enumerate(sec.arms):
        if a.baseline:
            continue
        pts = []
        for c, f in sorted(a.levels.items()):
            v, b = (f["throughput"].value if "throughput" in f else None), bt.get(c)
            if v and b:
                pts.append((c, v / b))
        if pts:
            lines.append((i, a.arm, pts))
    probe = sorted((b, f.value) for b, f in sec.probe.items() if f.value is not None)
    if not lines and not probe:
        return None
    fig, ax = _subplots((7.0, 3.6))
    for i, arm, pts in lines:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=_color(i), label=f"{arm} / {base.arm}")
    if probe:
        ax.plot([p[0] for p in probe], [p[1] for p in probe], marker="s", linestyle="--", color="black",
                label=f"FP8 GEMM probe, run {(sec.probe_run or '?')[:8]}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    xs = sorted({p[0] for _, _, pts in lines for p in pts} | {p[0] for p in probe})
    _log_x(ax, xs)
    ax.set_xlabel("batch = concurrency (requests in flight)" + ("; probe: GEMM batch rows" if probe else ""))
    ax.set_ylabel("speedup over the baseline")
    ax.set_title("Speedup against batch (derived from measured throughput)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ("speedup-vs-batch", "Speedup against batch",
            (f"Each arm's output throughput divided by {base.arm}'s at the same concurrency (derived from measured "
            "figures); dashed black, where the store has one: the node's FP8 GEMM probe speedup per batch "
            "(measured, `quantrack probe --track`)."), _png(fig))


def accuracy(sec: Section, c: Constraints) -> Picture | None:
    fig, ax = _subplots((7.0, 0.6 + 0.45 * max(2, len(sec.arms))))
    ys = list(range(len(sec.arms)))[::-1]
    any_drawn = False
    for y, a in zip(ys, sec.arms):
        d, ci = a.acc.delta.value, a.acc.delta_ci
        if a.baseline:
            ax.annotate("baseline (reference)" + ("" if a.acc.accuracy.known else ": GSM8K FILL IN"), (0, y),
                        fontsize=8, va="center", ha="center", color="grey")
        elif d is not None and ci is not None:
            ax.errorbar([d * 100], [y], xerr=[[(d - ci[0]) * 100], [(ci[1] - d) * 100]], fmt="o", capsize=4,
                        color="#1f77b4")
            ax.annotate(a.acc.delta.show(), (d * 100, y), fontsize=8, va="bottom", ha="center", xytext=(0, 5),
                        textcoords="offset points")
            any_drawn = True
        else:
            why = "GSM8K not measured for this arm" if not a.acc.accuracy.known else "no Δ interval (see Why)"
            ax.annotate(f"FILL IN: {why}", (0, y), fontsize=8, va="center", ha="center", color="#d62728")
    ax.axvline(0, color="grey", linewidth=0.8)
    if c.max_accuracy_drop is not None:
        ax.axvline(-c.max_accuracy_drop * 100, color="red", linestyle="--", linewidth=1)
        ax.text(-c.max_accuracy_drop * 100, 0.01, f"budget −{c.max_accuracy_drop * 100:g} pp ", color="red",
                fontsize=8, ha="right", va="bottom", transform=ax.get_xaxis_transform())
    ax.set_yticks(ys, labels=[a.arm for a in sec.arms])
    ax.set_ylim(-0.8, len(sec.arms) - 0.1)
    if not any_drawn:
        lim = (c.max_accuracy_drop or 0.01) * 100 * 2
        ax.set_xlim(-lim, lim)
    ax.set_xlabel("GSM8K Δ vs the baseline (percentage points), 95% interval")
    ax.set_title("Accuracy Δ with its 95% interval (derived from measured/imported GSM8K)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return ("accuracy", "Accuracy Δ with intervals",
            ("GSM8K Δ vs the baseline with its 95% interval (paired Newcombe where per-question records exist, "
            "else unpaired); red dashed: the accuracy budget. FILL IN = not measured."), _png(fig))


def kl(sec: Section, c: Constraints) -> Picture | None:
    arms = [a for a in sec.arms if not a.baseline or a.kl.value is not None]
    if not arms or not any(a.kl.value is not None for a in arms):
        return None
    fig, ax = _subplots((7.0, 3.4))
    names = [a.arm for a in arms]
    vals = [a.kl.value or 0.0 for a in arms]
    bars = ax.bar(names, vals, color=[_color(i) for i in range(len(arms))])
    for b, a in zip(bars, arms):
        txt = "FILL IN" if a.kl.value is None else f"{a.kl.value:.4f}" + (
            f"\ntop-1 {a.top1.value:.1%}" if a.top1.value is not None else "")
        ax.annotate(txt, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    if c.max_kl is not None:
        ax.axhline(c.max_kl, color="red", linestyle="--", linewidth=1, label=f"budget {c.max_kl:g}")
        ax.legend(fontsize=8)
    top = max(vals + [c.max_kl or 0.0])
    ax.set_ylim(0, top * 1.35 if top > 0 else 1)
    ax.set_ylabel("mean KL(baseline ‖ arm), nats/token")
    ax.set_title("KL fidelity per arm (measured)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return ("kl", "KL per arm", ("Mean KL divergence of each arm's next-token distribution from the baseline's over the "
            "top-k logprobs (measured), with top-1 agreement; red dashed: the KL budget."), _png(fig))


def pictures(sec: Section, c: Constraints) -> list[Picture]:
    out: list[Picture | None] = [capacity(sec)]
    wanted = [("tpot", "p50")] + [(s.metric, s.stat) for s in c.slos]
    for metric, stat in dict.fromkeys(wanted):
        out.append(latency(sec, c, metric, stat))
    out += [throughput(sec, c), speedup(sec), accuracy(sec, c), kl(sec, c)]
    return [p for p in out if p is not None]


__all__ = ["Picture", "pictures"]
