"""``quantrack preflight``: check arms against the rulebook on a GPU before renting or running.

Parse -> build one PreflightRequest -> preflight.run_preflight -> render. Exit 0 when nothing is
rejected, 3 when something is (or, with --strict, warned), 2 on bad input.
"""

from __future__ import annotations

from typing import Any

import click

from quantrack.cli.options import model_options, setting_option
from quantrack.engines import DEFAULT_ENGINE
from quantrack.errors import BadInput
from quantrack.study import EngineSpec, GpuSpec, Study

_SHAPE_FLAGS = ("params", "layers", "kv_heads", "head_dim")


def _number(flag: str, value: str, integer: bool) -> float:
    try:
        x = float(value.replace("_", "").replace(",", ""))
    except ValueError:
        raise BadInput(f"--{flag} must be a{'n integer' if integer else ' number'}, got {value!r}") from None
    if not 0 < x < float("inf") or (integer and x != int(x)):
        raise BadInput(f"--{flag} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return x


def model_from_options(opts: dict[str, Any]) -> Any:
    """A ModelShape from --model / --config / --gguf / --params..., or None when none is given."""
    from quantrack.hardware import catalog

    shape_given = [k for k in _SHAPE_FLAGS if opts.get(k) is not None]
    sources = [f"--{f}" for f in ("model", "config", "gguf") if opts.get(f)] + (["--params ..."] if shape_given else [])
    if len(sources) > 1:
        raise BadInput(f"give one model source, not {' and '.join(sources)}")
    if opts.get("model"):
        from quantrack.models.hub import resolve_model

        return resolve_model(opts["model"])
    if opts.get("config"):
        from quantrack.models.hfconfig import load_hf_config

        return load_hf_config(opts["config"])
    if opts.get("gguf"):
        from quantrack.models.ggufmeta import load_gguf

        return load_gguf(opts["gguf"])
    if shape_given:
        missing = [k for k in _SHAPE_FLAGS if opts.get(k) is None]
        if missing:
            raise BadInput("--params needs " + ", ".join("--" + k.replace("_", "-") for k in missing))
        return catalog.ModelShape(
            name="custom", params=_number("params", opts["params"], False),
            layers=int(_number("layers", opts["layers"], True)),
            kv_heads=int(_number("kv-heads", opts["kv_heads"], True)),
            head_dim=int(_number("head-dim", opts["head_dim"], True)), source="command-line shapes")
    return None


def build_request(opts: dict[str, Any]) -> Any:
    """One validated PreflightRequest from the options (BadInput on conflicts)."""
    from quantrack.arms import parse_arm_spec, with_baseline
    from quantrack.hardware.preflight import PreflightRequest, request_from_study, resolve_gpus

    if opts["study"] and opts["arm"]:
        raise BadInput("give --arm or --study, not both (a study file lists its own [[arms]])")
    if opts["mig"] is not None and opts["gpu"] and opts["gpu"].lower() == "auto":
        raise BadInput("--mig/--no-mig describe a catalog GPU; with --gpu auto NVML reports the MIG mode")
    model = model_from_options(opts)
    model_path = opts.get("gguf") or (model.hf_id if model is not None and model.hf_id else None)
    kvb = opts.get("kv_cache_memory_bytes")
    common = {"engine_version": opts["engine_version"], "cuda": opts["cuda"], "mig": opts["mig"],
              "util": opts["util"], "context_len": opts["context_len"], "tp": opts["tp"],
              "kv_cache_memory_bytes": None if kvb is None else int(_number("kv-cache-memory-bytes", kvb, True))}
    if opts["study"]:
        return request_from_study(opts["study"], gpu=opts["gpu"], engine=opts["engine"], model=model,
                                  model_path=model_path, **common)
    if not opts["arm"]:
        raise BadInput("no arms: give --arm (repeatable, e.g. --arm bf16 --arm fp8) or --study FILE")
    if not opts["gpu"]:
        raise BadInput("no GPU: give --gpu NAME (see `quantrack catalog gpus`) or --gpu auto")
    arms = with_baseline([parse_arm_spec(a) for a in opts["arm"]])
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise BadInput(f"--arm given twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    return PreflightRequest(gpus=resolve_gpus(opts["gpu"]), arms=arms, engine=opts["engine"] or DEFAULT_ENGINE,
                            model=model, model_path=model_path, **{**common, "tp": opts["tp"] or 1})


def gpu_line(g: dict[str, Any]) -> str:
    """One NVML device as read on this node (measured facts, not the catalog's)."""
    mig = {True: "enabled", False: "disabled", None: "not supported"}[g.get("mig")]
    catalog = g["catalog"] if g.get("in_catalog") else f"{g['catalog']} (not in the catalog)"
    return (f"gpu {g['index']} (NVML): {g['name']} -> {catalog}; compute capability {g['compute_capability']}; "
            f"{g['memory_mib']:,} MiB; driver {g['driver_version']}, CUDA driver {g['cuda_driver_version']}; "
            f"MIG {mig}")


def kv_scale_lines(k: dict[str, Any] | None) -> list[str]:
    """Preflight's KV-scale plan for one arm (quantrack.engines.kvplan.ScalePlan.to_dict()); nothing for an
    unquantized KV cache."""
    if not k or k.get("source") == "not-quantized":
        return []
    note = f" ({k['version_note']})" if k.get("version_note") else ""
    out = [f"  KV scales: {k['source']} [{k['rule_id']}] {k['message']}{note}"]
    if k.get("engine_source"):
        out.append(f"            source: {k['engine_source']}")
    out.append(f"            expect in the log: {k['log_line']}" if k.get("log_line")
               else "            expect in the log: no KV-scale line (the engine prints none here)")
    for m in k.get("measured") or []:
        out.append(f"            {evidence_head(m)}: {m['figure']} (store {m['store']}, run {m['run_id']})")
    return out


def evidence_head(m: dict[str, Any]) -> str:
    """What a rulebook [[measured]] entry is: quantrack's own earlier run of some model on some GPU, evidence that
    bears on this arm, never a measurement of it."""
    if m.get("model") and m.get("gpu"):
        return f"evidence from {m['model']} on {m['gpu']} ({m['engine']}), not this arm"
    return f"evidence from another study's {m['engine']} run (its model and GPU: the store named), not this arm"


_TOOLKIT = {"amd": "ROCm", "cpu": None}


def toolkit_head(report: Any) -> str:
    """The build the header names: CUDA for NVIDIA GPUs only (the CUDA the engine was built with); an AMD GPU's
    ROCm build is not asked for, so it is unknown; a CPU has none."""
    vendors = list(dict.fromkeys(g.get("vendor") or "unknown" for g in report.gpus)) or ["nvidia"]
    parts = []
    for v in vendors:
        if v == "nvidia":
            parts.append(f"CUDA build {report.cuda or 'not given'}")
        elif v in _TOOLKIT:
            kit = _TOOLKIT[v]
            parts.append(f"{kit} build unknown (not asked)" if kit else "CPU (no GPU toolkit)")
        else:
            parts.append(f"GPU toolkit unknown (vendor {v})")
    return ", ".join(parts)


def _cuda_note(report: Any) -> list[str]:
    """A CUDA build given (--cuda, [gpu] cuda) for a GPU it cannot describe: said, never shown as its header."""
    other = [g["name"] for g in report.gpus if (g.get("vendor") or "nvidia") != "nvidia"]
    if not report.cuda or not other:
        return []
    return [(f"note: CUDA build {report.cuda} was given, but {', '.join(other)} is not an NVIDIA GPU: CUDA does not "
             "apply to it")]


def render_report(report: Any, fmt: str, strict: bool) -> str:
    import json

    from quantrack.hardware.preflight import summary_rows
    from quantrack.render import render

    if fmt == "json":
        return json.dumps(report.to_dict(strict), indent=2, default=str)
    version = f"{report.engine} {report.engine_version}{' (assumed)' if report.version_assumed else ''}"
    head = f"preflight: {version}, {toolkit_head(report)}; verdict {report.verdict.upper()}"
    rows = summary_rows(report)
    out = [render(rows, "table", title=head, headers={"naive_tokens": "naive tokens*",
                                                      "engine_tokens": "engine tokens*"}),
           "* derived (arithmetic), not measured; '?' = rule not checked (a fact is missing)"]
    out += [gpu_line(g) for g in report.gpus if g.get("source") == "NVML"]
    for r in report.results:
        out.append(f"\n{r.gpu} / {r.arm}: {r.verdict.upper()}")
        for v in r.reasons:
            out.append(f"  {v.verdict:9} {v.rule_id}: {v.message}")
            if v.fix and v.verdict != "allow":
                out.append(f"            fix: {v.fix}")
            for line in v.log_lines:
                out.append(f"            expect in the log: {line}")
            out.append(f"            source: {v.source}")
        if r.capacity:
            c = r.capacity
            naive = f"naive {c['naive_tokens']:,} tokens, " if c.get("naive_tokens") is not None else ""
            at = f" at context {c['context_len']:,}" if c.get("context_len") else ""
            out.append(f"  capacity (derived): {naive}{report.engine}-aware {c.get('engine_tokens') or 0:,} tokens{at}")
        elif r.capacity_note:
            out.append(f"  capacity: {r.capacity_note}")
        out += kv_scale_lines(r.kv_scales)
        if r.flags:
            out.append("  engine flags: " + " ".join(f"{k} {v}" for k, v in r.flags.items()))
        if r.launch_display:
            if r.launch_env:
                out.append("  env: " + " ".join(f"{k}={v}" for k, v in r.launch_env.items()))
            ref = f"  ({r.model_ref} provisioned on first run)" if r.model_ref else ""
            out.append(f"  launch: {r.launch_display}{ref}")
        elif r.launch_note:
            out.append(f"  {r.launch_note}")
    for v in report.study:
        out.append(f"\nstudy: {v.verdict} {v.rule_id}: {v.message}\n  fix: {v.fix}\n  source: {v.source}")
    for n in report.notes:
        out.append(f"note: {n}")
    out += _cuda_note(report)
    return "\n".join(out)


def _budget_plan(path: str) -> list[str]:
    """With [eval] budget: the expected questions per arm to settle (derived), before anyone rents a GPU."""
    from quantrack.study import load_study

    study = load_study(path)
    if study.eval.budget is None:
        return []
    from quantrack.accuracy.budget import plan_lines
    from quantrack.accuracy.gsm8k import pool_size
    from quantrack.constraints import parse_accuracy_drop

    pool = min(study.eval.num_questions, pool_size(study.eval.task or "gsm8k", study.eval.num_shots))
    others = [a.name for a in study.arms if not a.baseline]
    return [""] + plan_lines(parse_accuracy_drop(study.eval.budget, "[eval] budget"), pool, others)


@click.command("preflight")
@click.option("--gpu", metavar="NAME|auto", help="Catalog GPU name, or 'auto' for every GPU NVML sees on this node.")
@setting_option(EngineSpec, "kind", name="engine", default=None, help="Engine (default vllm, or the study's).")
@setting_option(EngineSpec, "version", name="engine_version",
                help="Engine version, e.g. 0.33.0 (default: the version the rules were read from).")
@setting_option(GpuSpec, "cuda", help="CUDA version the engine was built with, e.g. 12.4 (not the driver's).")
@click.option("--mig/--no-mig", default=None, help="The catalog GPU is a MIG slice (NVML reports it with --gpu auto).")
@model_options
@click.option("--arm", multiple=True, metavar="ARM", help="Preset (bf16, fp8, fp8-kv, kv-fp8, int8, w4a16, awq, gptq) or weights=..,kv=..")
@click.option("--study", type=click.Path(dir_okay=False), help="A study file (TOML) instead of --arm.")
@setting_option(GpuSpec, "util", default=None)
@setting_option(Study, "context_len", default=None, help="Context length (--max-model-len; default: the study's "
                "or the model's).")
@setting_option(GpuSpec, "count", name="tp", default=None, help="Tensor-parallel size (default 1, or the study's).")
@click.option("--kv-cache-memory-bytes", metavar="INTEGER",
              help="vLLM only: KV cache bytes per GPU (replaces vLLM's memory profile; with --study, added to its "
                   "[engine] args). [integer ≥ 1]")
@click.option("--strict", is_flag=True, help="Exit 3 on warnings too.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.pass_context
def preflight(ctx: click.Context, **opts: Any) -> None:
    """Verdict (allow/warn/reject) per GPU x arm with rule ids and sources, derived capacity and
    the launch command. Exit 0 = nothing rejected, 3 = something rejected (--strict: or warned)."""
    from quantrack.hardware.preflight import run_preflight

    req = build_request(opts)
    report = run_preflight(req)
    click.echo(render_report(report, opts["fmt"], opts["strict"]))
    if opts.get("study") and opts["fmt"] == "table":
        click.echo("\n".join(_budget_plan(opts["study"])))
    ctx.exit(report.exit_code(opts["strict"]))
