"""``quantrack latency``: batch-1 TTFT/TPOT/ITL against a running server; merge saved rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from quantrack.cli.options import setting_option
from quantrack.errors import BadInput, MeasurementError
from quantrack.study import EngineSpec, LatencySpec

HELP = """Batch-1 latency against a running OpenAI-compatible server (measured).

Streams /v1/completions (or /v1/chat/completions with --chat) one request at a time:
warmup, then --iterations requests of exactly --input-tokens in (token ids from the
server's /tokenize) and --output-tokens out (ignore_eos, min_tokens where supported).
A sample that returns fewer or more tokens than asked fails with its reason.

\b
Formulas (per request; median, mean and 95% CI across requests):
  TTFT  = first output chunk - request start
  TPOT  = (e2e - TTFT) / (output tokens - 1)    (vLLM/SGLang definition)
  ITL   = gaps between output chunks (p50/p90/p95/p99, pooled)
  e2e   = last output chunk - request start
  decode tok/s = (output tokens - 1) / (e2e - TTFT)
  server TPOT (llama.cpp) = timings.predicted_per_token_ms
  95% CI = mean +/- t(0.975, n-1) * s / sqrt(n)

\b
Examples:
  quantrack latency --engine vllm --base-url http://127.0.0.1:8000 --label bf16 --save bf16.json
  quantrack latency --merge bf16.json fp8.json --format md
"""


@click.command("latency", help=HELP)
@setting_option(EngineSpec, "kind", name="engine", default=None, help="Engine behind --base-url.")
@click.option("--base-url", help="Server root, e.g. http://127.0.0.1:8000")
@click.option("--label", help="Name of this arm in saved rows and merged tables.")
@click.option("--save", "save", type=click.Path(dir_okay=False, path_type=Path), help="Write the result row (JSON).")
@setting_option(LatencySpec, "chat")
# the spellings of `vllm bench latency` (vllm@00cae0753:vllm/benchmarks/latency.py add_cli_args): same meaning
@setting_option(LatencySpec, "input_tokens", "--input-len")
@setting_option(LatencySpec, "output_tokens", "--output-len")
@setting_option(LatencySpec, "warmup", "--num-iters-warmup")
@setting_option(LatencySpec, "iterations", "--num-iters")
@click.option("--model", help="Model name to send (default: first id at /v1/models).")
@click.option("--api-key", envvar="OPENAI_API_KEY", show_envvar=True, help="Sent as Authorization: Bearer; never printed or saved.")
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds without data before a request fails.")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even if some samples failed.")
@click.option("--merge", is_flag=True, help="Merge saved rows (FILES) into one table instead of measuring.")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv", "json"]), default="table", show_default=True,
              help="How the result is printed: table (the full summary), json (the saved row), md/csv (one record).")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
def latency(
    engine: str | None,
    base_url: str | None,
    label: str | None,
    save: Path | None,
    chat: bool,
    input_tokens: int,
    output_tokens: int,
    warmup: int,
    iterations: int,
    model: str | None,
    api_key: str | None,
    timeout: float,
    allow_failures: bool,
    merge: bool,
    fmt: str,
    files: tuple[Path, ...],
) -> None:
    if merge:
        from quantrack.measure.latency import load_latency_rows

        click.echo(render_records(load_latency_rows(files), fmt))
        return
    if files:
        raise BadInput(f"unexpected argument {str(files[0])!r} (files are read only with --merge)")
    if not engine or not base_url:
        raise BadInput("--engine and --base-url are required (or use --merge FILES)")
    from quantrack.store.files import check_writable

    check_writable(save, "--save")  # before measuring: a result is never lost to a typo in the path

    from quantrack.interrupts import Interrupted
    from quantrack.measure.latency import measure_latency

    try:
        result = measure_latency(
            base_url,
            engine,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            warmup=warmup,
            iterations=iterations,
            chat=chat,
            api_key=api_key or None,
            model=model,
            progress=_progress(),
            timeout=timeout,
            label=label,
        )
    except Interrupted as exc:  # Ctrl-C: what was measured is printed and saved, then exit 130
        result = exc.partial
    _end_progress()
    row = result.to_row()
    click.echo(render_measured(row, fmt))
    if save:
        _save(save, row)
        click.echo(f"saved {save}" + (" (interrupted: partial)" if result.interrupted else ""))
    if result.interrupted:
        click.echo("quantrack: interrupted; kept what was measured", err=True)
        sys.exit(130)
    failed = row["n_failed"] + row["n_warmup_failed"]
    if failed and not allow_failures:
        reasons = "; ".join(f"{k} (x{v})" for k, v in {**row["failures"], **row["warmup_failures"]}.items())
        raise MeasurementError(f"{failed} of {warmup + iterations} requests failed: {reasons} (use --allow-failures to accept)")


def _save(path: Path, obj: dict[str, Any]) -> None:
    """Whole or not at all (a full disk leaves no 0-byte row): temp file + rename, one line naming the path."""
    from quantrack.store.files import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=2) + "\n", flag="--save")


def _progress() -> Any:
    """A one-line counter on stderr when it is a terminal (nothing in pipes and logs)."""
    if not sys.stderr.isatty():
        return None

    def show(phase: str, done: int, total: int) -> None:
        click.echo(f"\r{phase}: {done}/{total} requests", err=True, nl=False)

    return show


def _end_progress() -> None:
    if sys.stderr.isatty():
        click.echo("", err=True)


def _f(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def render_result(row: dict[str, Any]) -> str:
    """The human-readable result of one run: every figure labelled measured, formulas named."""
    from tabulate import tabulate  # type: ignore[import-untyped]

    lines = [
        f"latency (measured) - {row['label'] or '(no label)'}: {row['engine']} at {row['base_url']}, model {row['model']}",
        (
            f"endpoint /v1/{row['endpoint']}, input {row['input_tokens']} tokens ({row['prompt']}), "
            f"output {row['output_tokens']} tokens (ignore_eos)"
        ),
        (
            f"requests: {row['n_ok']} ok, {row['n_failed']} failed of {row['iterations']} "
            f"(+{row['warmup']} warmup, {row['n_warmup_failed']} failed)"
        )
        + ("  INTERRUPTED" if row["interrupted"] else ""),
    ]
    table = []
    names = [
        ("TTFT ms", "ttft_ms"),
        ("TPOT ms", "tpot_ms"),
        ("ITL ms (per chunk)", "itl_ms"),
        ("e2e ms", "e2e_ms"),
        ("decode tok/s", "decode_tok_s"),
    ]
    if row.get("server_tpot_ms"):
        names.append(("server TPOT ms (llama.cpp timings)", "server_tpot_ms"))
        names.append(("TPOT vs server, % per request", "tpot_vs_server_pct"))
    for title, key in names:
        sm = row.get(key)
        if not sm:
            table.append([title, "-", "-", "-", "-", "-", "-"])
            continue
        ci = f"{_f(sm['ci95_low'])} .. {_f(sm['ci95_high'])}" if sm.get("ci95_low") is not None else "-"
        table.append([title, _f(sm["median"]), _f(sm["mean"]), ci, _f(sm["p90"]), _f(sm.get("p95")), _f(sm["p99"]),
                      sm["n"]])
    lines.append(tabulate(table, headers=["", "median", "mean", "95% CI of mean", "p90", "p95", "p99", "n"]))
    if row.get("tpot_vs_server_median_pct") is not None:
        lines.append(f"client TPOT vs llama.cpp server TPOT (medians): {row['tpot_vs_server_median_pct']:+.2f}%")
    for reason, count in {**row["failures"], **row["warmup_failures"]}.items():
        lines.append(f"FAILED x{count}: {reason}")
    for note, count in row["notes"].items():
        lines.append(f"note x{count}: {note}")
    lines.append("formulas: " + "; ".join(row["formulas"][k] for k in ("ttft", "tpot", "itl", "e2e")))
    return "\n".join(lines)


def render_measured(row: dict[str, Any], fmt: str) -> str:
    """One measured row in the chosen --format: the summary table, the row as saved (json), or one record."""
    if fmt == "json":
        return json.dumps(row, indent=2)
    if fmt in ("md", "csv"):
        from quantrack.measure.latency import flatten_row

        return render_records([flatten_row(row, "measured")], fmt)
    return render_result(row)


def render_records(records: list[dict[str, Any]], fmt: str) -> str:
    """Merged rows as table / md / csv / json."""
    if fmt == "json":
        return json.dumps(records, indent=2)
    headers = list(records[0]) if records else []
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=headers, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return buf.getvalue().rstrip("\n")
    from tabulate import tabulate  # type: ignore[import-untyped]

    rows = [[_cell(r[h]) for h in headers] for r in records]
    return tabulate(rows, headers=headers, tablefmt="github" if fmt == "md" else "simple")


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)
