"""Plots (matplotlib, Agg backend, imported only when a plot is drawn).

``plot_speedup(rows_a, rows_b, path)``: speedup of arm B over baseline A against concurrency,
from two sweeps' rows (``quantrack sweep --save``; lab run.py rows are read by
:func:`sweep_rows_from_file`). Two measured ratios per level, both ">1 = arm faster":

* output throughput ratio = B output tok/s / A output tok/s
* TPOT ratio = A median TPOT / B median TPOT

Only levels present in both sweeps are drawn; a ratio with a missing side is left out, never
guessed. The tracking code can call the same function and log the PNG as an MLflow artifact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput

CONTENTION_UNKNOWN = "host contention not recorded"


def contention_note(states: dict[str, bool | None]) -> str:
    """The title note for a ratio of several arms' sweeps: ``{arm: contended}`` (None = not sampled)."""
    flagged = [a for a, c in states.items() if c]
    if flagged:
        return f"⚠ contention during {', '.join(flagged)}'s sweep"
    if states and all(c is False for c in states.values()):
        return "quiet host"
    return CONTENTION_UNKNOWN


def speedup_points(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per shared concurrency level: throughput ratio (B/A) and TPOT ratio (A/B); None if a side is missing."""
    rows_a = [r for r in rows_a if isinstance(r.get("concurrency"), int)]  # rate levels have their own x axis
    rows_b = [r for r in rows_b if isinstance(r.get("concurrency"), int)]
    by_a = {int(r["concurrency"]): r for r in rows_a}
    points = []
    for rb in sorted(rows_b, key=lambda r: int(r["concurrency"])):
        c = int(rb["concurrency"])
        ra = by_a.get(c)
        if ra is None:
            continue
        thr_a, thr_b = ra.get("output_tok_s"), rb.get("output_tok_s")
        tp_a, tp_b = ra.get("tpot_p50_ms"), rb.get("tpot_p50_ms")
        points.append(
            {
                "concurrency": c,
                "throughput_ratio": thr_b / thr_a if thr_a and thr_b else None,
                "tpot_ratio": tp_a / tp_b if tp_a and tp_b else None,
            }
        )
    return points


def plot_speedup(
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    path: str | Path,
    *,
    label_a: str = "baseline",
    label_b: str = "arm",
    contention: str | None = None,
) -> Path:
    """Write the speedup-vs-concurrency PNG; returns its path. BadInput if no level is shared.

    ``contention`` is what the two sweeps' hygiene recorded (:func:`contention_note`); a ratio built on a figure
    taken under contention carries the flag in its title, and an unrecorded host state is said as such."""
    points = speedup_points(rows_a, rows_b)
    if not points:
        raise BadInput("the two sweeps share no concurrency level; nothing to plot")
    from quantrack.report.figures import quiet_matplotlib

    quiet_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    try:
        for key, name, marker in (
            ("throughput_ratio", "output throughput ratio (arm / baseline)", "o"),
            ("tpot_ratio", "TPOT ratio (baseline / arm)", "s"),
        ):
            xs = [p["concurrency"] for p in points if p[key] is not None]
            ys = [p[key] for p in points if p[key] is not None]
            if xs:
                ax.plot(xs, ys, marker=marker, label=name)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_xticks([p["concurrency"] for p in points], labels=[str(p["concurrency"]) for p in points])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("speedup (>1 = arm faster)")
        ax.set_title(f"{label_b} vs {label_a} (measured; {contention or CONTENTION_UNKNOWN})",
                     color="#b45309" if (contention or "").startswith("⚠") else "black", fontsize=10)
        ax.legend(loc="best", fontsize=8)
        ax.grid(True, alpha=0.3)
        out = Path(path)
        fig.tight_layout()
        import io

        from quantrack.store.files import write_atomic

        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        write_atomic(out, buf.getvalue())  # a full disk leaves no 0-byte PNG, and the message names it
    finally:
        plt.close(fig)
    return out


ENGINE_PANELS = (("kv_usage_max", "KV-cache usage (max, fraction)"), ("running_max", "running requests (max)"),
                 ("waiting_max", "waiting requests (max)"), ("prefix_cache_hit_rate", "prefix-cache hit rate"))


def plot_engine_metrics(rows: list[dict[str, Any]], path: str | Path, *, label: str = "arm") -> Path | None:
    """The engine's own figures per level (scraped from its /metrics) beside the measured output tok/s; None
    when no level carries a scraped figure. The x axis is the level (cN or rN/s) in the order measured."""
    pts = [(r, r.get("server_metrics") or {}) for r in rows]
    panels = [(k, t) for k, t in ENGINE_PANELS if any(isinstance(m.get(k), (int, float)) for _, m in pts)]
    if not panels:
        return None
    from quantrack.report.figures import quiet_matplotlib

    quiet_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quantrack.measure.sweep import level_label

    labels = [level_label(r) for r, _ in pts]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(6.4, 1.9 * (len(panels) + 1)), dpi=120, sharex=True)
    try:
        xs = list(range(len(pts)))
        tps = [r.get("output_tok_s") for r, _ in pts]
        axes[0].plot([x for x, v in zip(xs, tps) if v is not None], [v for v in tps if v is not None], marker="o")
        axes[0].set_ylabel("out tok/s", fontsize=8)
        axes[0].set_title(f"{label}: throughput and the engine's own view (measured)", fontsize=9)
        for ax, (key, title) in zip(axes[1:], panels):
            vals = [m.get(key) for _, m in pts]
            ax.plot([x for x, v in zip(xs, vals) if isinstance(v, (int, float))],
                    [v for v in vals if isinstance(v, (int, float))], marker="s", color="tab:orange")
            ax.set_ylabel(title, fontsize=7)
            ax.grid(True, alpha=0.3)
        axes[-1].set_xticks(xs, labels=labels)
        axes[-1].set_xlabel("level (cN = N in flight, rN = N requests/s)")
        out = Path(path)
        fig.tight_layout()
        fig.savefig(out, format="png")
    finally:
        plt.close(fig)
    return out


def sweep_rows_from_file(path: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """(label, rows) from a ``quantrack sweep --save`` file or a lab run.py latency row.

    Lab rows hold ``batch1`` (concurrency 1: TPOT only, no throughput) and ``concN`` sections
    with ``out_tok_per_s`` and ``tpot_ms``; the statistic behind them is not stated in the file.
    """
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"--plot: no such file {str(p)!r}") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"--plot: {p} is not JSON: {exc}") from None
    if isinstance(obj, dict) and isinstance(obj.get("rows"), list):
        return str(obj.get("label") or p.stem), obj["rows"]
    if isinstance(obj, dict) and any(k.startswith("conc") for k in obj):
        rows: list[dict[str, Any]] = []
        if isinstance(obj.get("batch1"), dict):
            rows.append({"concurrency": 1, "output_tok_s": None, "tpot_p50_ms": obj["batch1"].get("tpot_ms")})
        for key, val in obj.items():
            if key.startswith("conc") and key[4:].isdigit() and isinstance(val, dict):
                rows.append({"concurrency": int(key[4:]), "output_tok_s": val.get("out_tok_per_s"), "tpot_p50_ms": val.get("tpot_ms")})
        return str(obj.get("label") or p.stem), rows
    raise BadInput(f"--plot: {p} is not a sweep file (no 'rows') nor a lab run.py row (no 'concN')")

