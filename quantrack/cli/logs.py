"""``quantrack logs``: parse engine startup logs; reconcile a log with the capacity plan."""

from __future__ import annotations

import json
from typing import Any

import click

from quantrack.engines import ENGINE_KINDS

_ENGINES = ["auto", *ENGINE_KINDS]
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
@click.option("--gpu", default=None,
              help="GPU catalog name (required for vLLM/SGLang logs unless the log reports the device total).")
@click.option("--vram", default=None,
              help="Device memory to predict with (23.58GiB, 24 = GiB, 16GB); wins over the log's total and --gpu.")
@click.option("--util", type=float, default=None, help="gpu_memory_utilization / mem_fraction_static used.")
@click.option("--context-len", type=int, default=None, help="Context length (default: from the log).")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None,
              help="vLLM: tokens the profile run used (V0 without chunked prefill: max_model_len). "
                   "Default: vLLM V1's default for the GPU.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None,
              help="vLLM: max_num_seqs the engine ran with (V0 default 256). Default: V1's default for the GPU.")
@click.option("--engine", type=click.Choice(_ENGINES), default="auto", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def reconcile_cmd(file: str, model: str, gpu: str | None, vram: str | None, util: float | None,
                  context_len: int | None, max_num_batched_tokens: int | None, max_num_seqs: int | None,
                  engine: str, fmt: str) -> None:
    """The engine-aware prediction (derived) next to the log's figures (measured), error in %.

    Device memory: --vram if given, else the total the log reports (vLLM V0's total_gpu_memory), else --gpu's."""
    from quantrack.engines import reconcile

    result = reconcile(file, model, gpu=gpu, util=util, context_len=context_len, engine=engine, vram=vram,
                       max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2, default=str))
        return
    from quantrack.render import render

    title = (f"{result['engine']} log vs plan: model {result['model']}, gpu {result['gpu'] or '-'}, "
             f"arm {result['arm']['name']} (inferred from the log), context {result['context_len']}")
    click.echo(render(result["rows"], "table", title=title,
                      headers={"predicted": "predicted (derived)", "log": "log (measured)", "error_pct": "error %"}))
    if result.get("memory_basis"):
        click.echo(f"device memory: {result['memory_basis']}")
    settings = result.get("settings") or {}
    if settings:
        given = max_num_batched_tokens is not None or max_num_seqs is not None
        click.echo("vLLM profile settings: " + ", ".join(f"{k} {v}" for k, v in settings.items())
                   + ("" if given else " (vLLM V1 defaults for this GPU: give --max-num-batched-tokens / "
                                       "--max-num-seqs for the settings the log ran with)"))


reconcile_cmd.name = "reconcile"
