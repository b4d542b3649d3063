"""``quantrack logs``: parse engine startup logs; reconcile a log with the capacity plan."""

from __future__ import annotations

import json
from typing import Any

import click

_ENGINES = ["auto", "vllm", "sglang", "llamacpp"]
_COLUMNS = ["source", "engine", "engine_version", "weights_gib", "available_kv_gib", "kv_cache_tokens",
            "max_concurrency", "max_concurrency_context", "cuda_graph_gib", "quantization", "linear_kernel",
            "attention_backend", "kv_cache_dtype", "dtype", "fallbacks", "warnings", "errors", "not_found"]


@click.group("logs")
def logs() -> None:
    """Parse engine startup logs (vLLM, SGLang, llama.cpp); reconcile them with the plan."""


def _row(report: Any) -> dict[str, Any]:
    from pathlib import Path

    d = report.to_dict()
    d["source"] = Path(d["source"]).name if d.get("source") else None
    for key in ("fallbacks", "warnings", "errors"):
        d[key] = [f"{e['kind']}@{e['line_no']}" for e in d[key]]
    return {k: d.get(k) for k in _COLUMNS}


@logs.command("parse")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--engine", type=click.Choice(_ENGINES), default="auto", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def parse(files: tuple[str, ...], engine: str, fmt: str) -> None:
    """Figures from startup logs (each 'measured by the engine'); JSON is a list of reports."""
    from quantrack.engines import parse_logs

    reports = parse_logs(files, engine)
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in reports], indent=2, default=str))
        return
    from quantrack.render import render

    rows = [_row(r) for r in reports]
    # one column per log reads better than one very wide row per log
    table = [{"field": col, **{f"[{i}]": row[col] for i, row in enumerate(rows)}} for col in _COLUMNS]
    click.echo(render(table, "table", title="startup logs (figures as printed by the engine)"))


@logs.command("reconcile")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--model", required=True, help="Model catalog name (see `quantrack catalog`).")
@click.option("--gpu", default=None, help="GPU catalog name (required for vLLM/SGLang logs).")
@click.option("--util", type=float, default=None, help="gpu_memory_utilization / mem_fraction_static used.")
@click.option("--context-len", type=int, default=None, help="Context length (default: from the log).")
@click.option("--engine", type=click.Choice(_ENGINES), default="auto", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def reconcile_cmd(file: str, model: str, gpu: str | None, util: float | None, context_len: int | None,
                  engine: str, fmt: str) -> None:
    """The engine-aware prediction (derived) next to the log's figures (measured), error in %."""
    from quantrack.engines import reconcile

    result = reconcile(file, model, gpu=gpu, util=util, context_len=context_len, engine=engine)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2, default=str))
        return
    from quantrack.render import render

    title = (f"{result['engine']} log vs plan: model {result['model']}, gpu {result['gpu'] or '-'}, "
             f"arm {result['arm']['name']} (inferred from the log), context {result['context_len']}")
    click.echo(render(result["rows"], "table", title=title,
                      headers={"predicted": "predicted (derived)", "log": "log (measured)", "error_pct": "error %"}))


reconcile_cmd.name = "reconcile"
