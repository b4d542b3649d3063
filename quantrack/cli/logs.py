"""``quantrack logs``: parse engine startup logs; reconcile a log with the capacity plan."""

from __future__ import annotations

import json
from typing import Any

import click

from quantrack.cli.options import model_options
from quantrack.engines import ENGINE_KINDS

_ENGINES = ["auto", *ENGINE_KINDS]
_COLUMNS = ["source", "engine", "engine_evidence", "engine_version", "weights_gib", "available_kv_gib", "kv_cache_tokens",
            "max_concurrency", "max_concurrency_context", "cuda_graph_gib", "quantization", "linear_kernel",
            "attention_backend", "kv_cache_dtype", "dtype", "fallbacks", "fallback_gate", "warnings", "errors",
            "failed_start", "not_found"]


@click.group("logs")
def logs() -> None:
    """Parse engine startup logs (vLLM, SGLang, llama.cpp); reconcile them with the plan."""


def _row(report: Any) -> dict[str, Any]:
    from pathlib import Path

    d = report.to_dict()
    d["source"] = Path(d["source"]).name if d.get("source") else None
    for key in ("fallbacks", "warnings", "errors"):
        d[key] = [f"{e['kind']}@{e['line_no']}" for e in d[key]]
    ex = d.get("extra") or {}
    d["failed_start"] = (ex.get("startup_failure") or "yes") if ex.get("startup_failed") else "no"
    gate = ex.get("fallback_gate")  # set by parse from hardware.rulebook.report_gate
    d["fallback_gate"] = (f"{gate['kind']} (rule {gate['rule']})" if gate["state"] == "yes" else
                          f"unknown: {gate['reason']}") if gate else None
    for key in ("weights_gib", "cuda_graph_gib"):  # the log printed a figure that is not a size (JSON: extra says why)
        if d.get(key) is None and ex.get(f"{key}_unknown"):
            d[key] = "unknown"
    ev = d.get("engine_evidence") or []
    d["engine_evidence"] = "; ".join(f"{e['marker']}@{e['line_no']}" for e in ev[:2]) or None
    return {k: d.get(k) for k in _COLUMNS}


@logs.command("parse")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--engine", type=click.Choice(_ENGINES), default="auto", show_default=True,
              help="auto: score every engine's markers line by line and take the clear winner.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def parse(files: tuple[str, ...], engine: str, fmt: str) -> None:
    """Figures from startup logs (each 'measured by the engine'); JSON is a list of reports, each with the lines
    that decided its engine (engine_evidence).

    A log whose engine is not clear is refused with the closest candidates: pass --engine."""
    from quantrack.engines import parse_logs, unclear_engine_message
    from quantrack.errors import BadInput
    from quantrack.hardware.rulebook import report_gate

    reports = parse_logs(files, engine)
    for r in reports:
        if r.engine is None:
            raise BadInput(unclear_engine_message(r))
        gate = None if r.fallbacks else report_gate(r)  # FP8 weights, no fallback line: the GPU's FP8 gate
        if gate is not None:
            r.extra["fallback_gate"] = gate.to_dict()
    if fmt == "json":
        click.echo(json.dumps([r.to_dict() for r in reports], indent=2, default=str))
        return
    from quantrack.render import render

    rows = [_row(r) for r in reports]
    # one column per log reads better than one very wide row per log
    table = [{"field": col, **{f"[{i}]": row[col] for i, row in enumerate(rows)}} for col in _COLUMNS]
    click.echo(render(table, "table", title="startup logs (figures as printed by the engine)"))


_SHAPE_FLAGS = ("params", "layers", "kv_heads", "head_dim")


def _shape(opts: dict[str, Any]) -> Any:
    """The model from the shared model options (cli/options.py), resolved as ``plan`` does."""
    from quantrack.errors import BadInput
    from quantrack.hardware import catalog

    shapes = [k for k in _SHAPE_FLAGS if opts.get(k) is not None]
    sources = [f for f in ("model", "config", "gguf") if opts.get(f)] + (["params ..."] if shapes else [])
    if len(sources) > 1:
        raise BadInput(f"give one model source, not {' and '.join('--' + s for s in sources)}")
    if not sources:
        raise BadInput("no model: give --model NAME, --config FILE, --gguf FILE or --params/--layers/--kv-heads/"
                       "--head-dim")
    if opts.get("model"):
        from quantrack.models.hub import resolve_model

        return resolve_model(opts["model"])  # a catalog name, or ORG/NAME[@REV] from the Hub
    if opts.get("config"):
        from quantrack.models.hfconfig import load_hf_config

        return load_hf_config(opts["config"])
    if opts.get("gguf"):
        from quantrack.models.ggufmeta import load_gguf

        return load_gguf(opts["gguf"])
    missing = [k for k in _SHAPE_FLAGS if opts.get(k) is None]
    if missing:
        raise BadInput("--params needs " + ", ".join("--" + k.replace("_", "-") for k in missing))
    values: dict[str, float] = {}
    for k in _SHAPE_FLAGS:
        try:
            values[k] = float(str(opts[k]).replace("_", "").replace(",", ""))
        except ValueError:
            raise BadInput(f"--{k.replace('_', '-')} must be a number, got {opts[k]!r}") from None
        if not values[k] > 0:
            raise BadInput(f"--{k.replace('_', '-')} must be greater than zero, got {opts[k]!r}")
    return catalog.ModelShape(name="custom", params=values["params"], layers=int(values["layers"]),
                              kv_heads=int(values["kv_heads"]), head_dim=int(values["head_dim"]),
                              source="command-line shapes")


@logs.command("reconcile")
@click.argument("file", type=click.Path(dir_okay=True))
@model_options
@click.option("--arm", "arm_spec", default=None, metavar="ARM",
              help="The arm the log ran (a preset such as bf16, fp8, fp8-kv, or weights=..,kv=..). Default: from the "
                   "log's quantization lines; when they do not establish it, reconcile refuses.")
@click.option("--gpu", default=None,
              help="GPU catalog name (required for vLLM/SGLang logs unless the log reports the device total).")
@click.option("--vram", default=None,
              help="Device memory to predict with (23.58GiB, 24 = GiB, 16GB); wins over the log's total and --gpu.")
@click.option("--util", type=float, default=None, help="gpu_memory_utilization / mem_fraction_static used.")
@click.option("--context-len", type=int, default=None, help="Context length (default: from the log).")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size (default: from the log; it must agree).")
@click.option("--pp", type=int, default=None, help="Pipeline-parallel size (pp > 1 is refused: not modelled).")
@click.option("--dp", type=int, default=None, help="Data-parallel replicas (default: from the log).")
@click.option("--slots", type=int, default=None, help="llama.cpp: parallel slots (-np; default: from the log).")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None,
              help="vLLM: tokens the profile run used (V0 without chunked prefill: max_model_len). "
                   "Default: vLLM V1's default for the GPU.")
@click.option("--max-num-seqs", type=click.IntRange(min=1, max=2**31 - 1), default=None,  # the engine's C int
              help="vLLM: max_num_seqs the engine ran with (V0 default 256). Default: V1's default for the GPU.")
@click.option("--sized-before-failure", is_flag=True, default=False,
              help="Compare a start that failed after the engine sized its KV cache (a max model length the cache "
                   "cannot hold): the sized cache is measured. Refused for a failure that sized nothing.")
@click.option("--engine", type=click.Choice(_ENGINES), default="auto", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def reconcile_cmd(file: str, arm_spec: str | None, gpu: str | None, vram: str | None, util: float | None,
                  context_len: int | None, tp: int | None, pp: int | None, dp: int | None, slots: int | None,
                  max_num_batched_tokens: int | None, max_num_seqs: int | None, sized_before_failure: bool,
                  engine: str, fmt: str, **model_opts: Any) -> None:
    """The engine-aware prediction (derived) next to the log's figures (measured), error in %, per rank and in
    total.

    The arm comes from the log's quantization lines or --arm; device memory: --vram if given, else the total the
    log reports (vLLM V0's total_gpu_memory), else --gpu's. A start that failed is reported, not compared (see
    --sized-before-failure); a llama.cpp log that states no context needs --context-len."""
    from quantrack.engines.reconcile import reconcile

    arm = None
    if arm_spec is not None:
        from quantrack.arms import parse_arm_spec

        arm = parse_arm_spec(arm_spec)
    shape = _shape(model_opts)
    result = reconcile(file, shape, gpu=gpu, util=util, context_len=context_len, engine=engine, vram=vram, tp=tp,
                       pp=pp, dp=dp, arm=arm, slots=slots, max_num_batched_tokens=max_num_batched_tokens,
                       max_num_seqs=max_num_seqs, sized_before_failure=sized_before_failure)
    if fmt == "json":
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
        return
    from quantrack.render import render

    data = result.to_dict()
    layout = ", ".join(f"{k} {v}" for k, v in result.parallel.items())
    title = (f"{result.engine} log vs plan: model {result.model}, gpu {result.gpu or '-'}, "
             f"arm {result.arm.name} (from {result.arm_source}), {layout}, context {result.context_len}")
    click.echo(render(data["rows"], "table", title=title,
                      headers={"predicted": "predicted (derived)", "log": "log (measured)", "error_pct": "error %"}))
    if result.startup_failure:
        click.echo(f"FAILED start: {result.startup_failure}; compared: the KV cache the engine sized before it "
                   "refused (--sized-before-failure)")
    click.echo("parallel layout: " + "; ".join(f"{k} {result.parallel[k]} ({v})"
                                                  for k, v in result.parallel_basis.items()))
    if result.memory_basis:
        click.echo(f"device memory: {result.memory_basis}")
    settings = result.settings
    if settings:
        given = max_num_batched_tokens is not None or max_num_seqs is not None
        click.echo("vLLM profile settings: " + ", ".join(f"{k} {v}" for k, v in settings.items())
                   + ("" if given else " (vLLM V1 defaults for this GPU: give --max-num-batched-tokens / "
                                       "--max-num-seqs for the settings the log ran with)"))


reconcile_cmd.name = "reconcile"
