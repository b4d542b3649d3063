"""``quantrack sweep``: throughput/latency at several concurrency levels; speedup plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from quantrack.cli.options import setting_option
from quantrack.errors import BadInput, MeasurementError
from quantrack.study import EngineSpec, LatencySpec, SweepSpec

HELP = """Throughput and latency at several concurrency levels (measured).

At each level exactly C requests are kept in flight until --requests have finished
(default 4 x C, at least 8), each with --input-tokens in (token ids from the server's
/tokenize) and --output-tokens out (ignore_eos). Per level: output throughput, TTFT and
TPOT p50/p90/p99, failures.

\b
Formulas:
  output tok/s = sum(usage.completion_tokens of ok requests) / level wall time
  level wall time = first request sent -> last request finished
  TPOT = (e2e - TTFT) / (output tokens - 1) per request

\b
Examples:
  quantrack sweep --engine vllm --base-url http://127.0.0.1:8000 --concurrency 1,4,16,64 --save fp8.json
  quantrack sweep --plot bf16.json fp8.json --out speedup.png
"""


@click.command("sweep", help=HELP)
@setting_option(EngineSpec, "kind", name="engine", default=None, help="Engine behind --base-url.")
@click.option("--base-url", help="Server root, e.g. http://127.0.0.1:8000")
@setting_option(SweepSpec, "concurrency", default=(1, 4, 16, 64), help="Comma-separated levels.")
@setting_option(SweepSpec, "requests_per_level")
# --random-input-len / --random-output-len: `vllm bench serve` and `sglang.bench_serving` (random dataset,
# sglang@0033168f0:python/sglang/bench_serving.py usage); --input-len / --output-len: `vllm bench latency`
@setting_option(SweepSpec, "input_tokens", "--input-len", "--random-input-len", default=1024,
                help="Prompt length in tokens.")
@setting_option(SweepSpec, "output_tokens", "--output-len", "--random-output-len", default=128,
                help="Output tokens per request (ignore_eos); TPOT needs two.")
@setting_option(LatencySpec, "warmup", default=2, help="Requests sent one at a time before the first level.")
@click.option("--num-prompts", type=int, hidden=True, expose_value=False, callback=lambda _c, _p, v: _no_num_prompts(v))
@click.option("--chat", is_flag=True, help="Use /v1/chat/completions (prompt length becomes approximate).")
@click.option("--model", help="Model name to send (default: first id at /v1/models).")
@click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True, help="Sent as Authorization: Bearer; never printed or saved.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds without data before a request fails.")
@click.option("--label", help="Name of this arm in saved files and plots.")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), help="Write the sweep (JSON, rows per level).")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even if some requests failed.")
@click.option("--plot", is_flag=True, help="Plot speedup of FILES[1] over FILES[0] instead of measuring.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("speedup.png"), show_default=True)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
def sweep(
    engine: str | None,
    base_url: str | None,
    concurrency: tuple[int, ...],
    requests_per_level: int,
    input_tokens: int,
    output_tokens: int,
    warmup: int,
    chat: bool,
    model: str | None,
    api_key: str | None,
    timeout: float,
    label: str | None,
    save: Path | None,
    allow_failures: bool,
    plot: bool,
    out: Path,
    files: tuple[Path, ...],
) -> None:
    if plot:
        if len(files) != 2:
            raise BadInput(f"--plot needs two sweep files: BASELINE ARM (got {len(files)})")
        from quantrack.report.plots import (
            plot_speedup,
            speedup_points,
            sweep_rows_from_file,
        )

        label_a, rows_a = sweep_rows_from_file(files[0])
        label_b, rows_b = sweep_rows_from_file(files[1])
        path = plot_speedup(rows_a, rows_b, out, label_a=label_a, label_b=label_b)
        click.echo(_render_points(speedup_points(rows_a, rows_b), label_a, label_b))
        click.echo(f"wrote {path}")
        return
    if files:
        raise BadInput(f"unexpected argument {str(files[0])!r} (files are read only with --plot)")
    if not engine or not base_url:
        raise BadInput("--engine and --base-url are required (or use --plot BASE.json ARM.json)")

    from quantrack.interrupts import Interrupted
    from quantrack.measure.sweep import run_sweep

    try:
        result = run_sweep(
            base_url,
            engine,
            list(concurrency),
            requests_per_level=requests_per_level or None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            warmup=warmup,
            chat=chat,
            api_key=api_key or None,
            model=model,
            progress=_progress(),
            timeout=timeout,
            label=label,
        )
    except Interrupted as exc:  # Ctrl-C: what was measured is printed and saved, then exit 130
        result = exc.partial
    if sys.stderr.isatty():
        click.echo("", err=True)
    data = result.to_dict()
    click.echo(_render_sweep(data))
    if save:
        from quantrack.store.files import atomic_write_text

        atomic_write_text(save, json.dumps(data, indent=2) + "\n", flag="--save")
        click.echo(f"saved {save}" + (" (interrupted: partial)" if result.interrupted else ""))
    if result.interrupted:
        click.echo("quantrack: interrupted; kept the finished levels", err=True)
        sys.exit(130)
    failed = result.n_failed + len(result.warmup_errors)
    if failed and not allow_failures:
        reasons: dict[str, int] = {}
        for row in data["rows"]:
            for k, v in row["failures"].items():
                reasons[k] = reasons.get(k, 0) + v
        for e in result.warmup_errors:
            reasons[e] = reasons.get(e, 0) + 1
        text = "; ".join(f"{k} (x{v})" for k, v in reasons.items())
        raise MeasurementError(f"{failed} requests failed: {text} (use --allow-failures to accept)")


def _no_num_prompts(value: int | None) -> None:
    """vLLM/SGLang's --num-prompts counts every request of a run; quantrack's --requests counts per level."""
    if value is not None:
        raise BadInput("--num-prompts (vllm bench serve / sglang.bench_serving) counts the requests of the whole "
                       "run; quantrack sweep measures each level separately: give --requests N per level")


def _f(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _render_sweep(data: dict[str, Any]) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    head = (
        f"sweep (measured) - {data['label'] or '(no label)'}: {data['engine']} at {data['base_url']}, model {data['model']}\n"
        f"input {data['input_tokens']} tokens ({data['prompt']}), output {data['output_tokens']} tokens (ignore_eos)"
    )
    table = []
    for r in data["rows"]:
        tt, tp = r["ttft_ms"] or {}, r["tpot_ms"] or {}
        table.append(
            [
                r["concurrency"],
                f"{r['n_ok']}/{r['requests']}",
                _f(r["wall_s"]),
                _f(r["output_tok_s"], 1),
                _f(tt.get("p50")),
                _f(tt.get("p90")),
                _f(tt.get("p99")),
                _f(tp.get("p50")),
                _f(tp.get("p90")),
                _f(tp.get("p99")),
            ]
        )
    headers = ["conc", "ok/sent", "wall s", "out tok/s", "TTFT p50", "p90", "p99", "TPOT p50 ms", "p90", "p99"]
    lines = [head, tabulate(table, headers=headers)]
    for r in data["rows"]:
        for reason, n in r["failures"].items():
            lines.append(f"FAILED x{n} at concurrency {r['concurrency']}: {reason}")
    if data["interrupted"]:
        lines.append("INTERRUPTED: levels after the last row were not measured")
    lines.append("formulas: " + "; ".join(data["formulas"][k] for k in ("output_tok_s", "wall_s", "tpot")))
    return "\n".join(lines)


def _render_points(points: list[dict[str, Any]], label_a: str, label_b: str) -> str:
    from tabulate import tabulate  # type: ignore[import-untyped]

    rows = [[p["concurrency"], _f(p["throughput_ratio"], 3), _f(p["tpot_ratio"], 3)] for p in points]
    return f"speedup of {label_b} over {label_a} (measured ratios, >1 = {label_b} faster)\n" + tabulate(
        rows, headers=["concurrency", "out tok/s ratio", "TPOT ratio (base/arm)"]
    )


def _progress() -> Any:
    if not sys.stderr.isatty():
        return None

    def show(phase: str, done: int, total: int) -> None:
        click.echo(f"\r{phase}: {done}/{total} requests   ", err=True, nl=False)

    return show
