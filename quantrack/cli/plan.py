"""``quantrack plan``: derived capacity per arm (weights, KV budget, tokens, concurrency).

Parse -> build one PlanRequest -> capacity.run_plan -> render. Every number printed is derived.
"""

from __future__ import annotations

from typing import Any

import click

from quantrack.cli.options import model_options, setting_option
from quantrack.engines import DEFAULT_UTIL, GPU_ENGINE_KINDS, get_adapter
from quantrack.errors import BadInput
from quantrack.study import GpuSpec, Study

_SHAPE_FLAGS = ("params", "layers", "kv_heads", "head_dim")


def _positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise BadInput(f"--{name} must be an integer, got {value!r}") from None
    if n <= 0:
        raise BadInput(f"--{name} must be greater than zero, got {value!r}")
    return n


def _positive_float(name: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        x = float(value.replace("_", "").replace(",", ""))
    except ValueError:
        raise BadInput(f"--{name} must be a number, got {value!r}") from None
    if not x > 0 or x == float("inf"):
        raise BadInput(f"--{name} must be greater than zero, got {value!r}")
    return x


def build_request(opts: dict[str, Any]) -> Any:
    """Turn the command's options into one validated capacity.PlanRequest (BadInput on any conflict)."""
    from quantrack.arms import default_arms, parse_arm_spec, with_baseline
    from quantrack.hardware import capacity, catalog, units

    given_shape = [k for k in _SHAPE_FLAGS + ("hidden_size", "vocab_size") if opts.get(k) is not None]
    sources = [f for f in ("model", "config", "gguf") if opts.get(f)] + (["params ..."] if given_shape else [])
    if len(sources) > 1:
        raise BadInput(f"give one model source, not {' and '.join('--' + s for s in sources)}")
    if not sources:
        raise BadInput("no model: give --model NAME, --config FILE, --gguf FILE or --params/--layers/--kv-heads/--head-dim")
    if opts.get("model"):
        from quantrack.models.hub import resolve_model

        shape = resolve_model(opts["model"])
    elif opts.get("config"):
        from quantrack.models.hfconfig import load_hf_config

        shape = load_hf_config(opts["config"])
    elif opts.get("gguf"):
        from quantrack.models.ggufmeta import load_gguf

        shape = load_gguf(opts["gguf"])
    else:
        missing = [k for k in _SHAPE_FLAGS if opts.get(k) is None]
        if missing:
            raise BadInput("--params needs " + ", ".join("--" + k.replace("_", "-") for k in missing))
        shape = catalog.ModelShape(
            name="custom", params=_positive_float("params", opts["params"]) or 0.0,
            layers=_positive_int("layers", opts["layers"]) or 0,
            kv_heads=_positive_int("kv-heads", opts["kv_heads"]) or 0,
            head_dim=_positive_int("head-dim", opts["head_dim"]) or 0,
            hidden_size=_positive_int("hidden-size", opts.get("hidden_size")),
            vocab_size=_positive_int("vocab-size", opts.get("vocab_size")),
            source="command-line shapes",
        )
    if opts.get("vram") and opts.get("gpu"):
        raise BadInput("give --vram or --gpu, not both")
    gpu_name = None
    if opts.get("vram"):
        memory = units.parse_memory(opts["vram"], what="--vram")
        unit = units.unit_of(opts["vram"])
        decimal = units.is_decimal(unit)
        label = f"{opts['vram']} (--vram{'; bare number = GiB' if unit == 'GiB' and opts['vram'].strip()[-1:].isdigit() else ''})"
    elif opts.get("gpu"):
        gpu = catalog.get_gpu(opts["gpu"])
        if gpu.vendor == "cpu" or gpu.total_bytes <= 0:
            raise BadInput(f"--gpu {gpu.name} has no fixed memory; give --vram with the RAM to use instead")
        memory, decimal, label, gpu_name = gpu.total_bytes, False, gpu.memory_basis, gpu.name
    else:
        raise BadInput("no memory: give --vram (24, 24GiB, 16GB) or --gpu NAME")
    util = opts.get("util")
    if util is not None:
        try:
            util = float(util)
        except ValueError:
            raise BadInput(f"--util must be a number in (0, 1], got {opts['util']!r}") from None
        if not 0 < util <= 1:
            raise BadInput(f"--util must be in (0, 1], got {opts['util']}")
    overhead = 0
    if opts.get("overhead") not in (None, "0", "0GiB", "0GB"):
        overhead = units.parse_memory(opts["overhead"], what="--overhead")
    tp = _positive_int("tp", opts.get("tp")) or 1
    ctx = _positive_int("context-len", opts.get("context_len")) or 4096
    mnbt = _positive_int("max-num-batched-tokens", opts.get("max_num_batched_tokens"))
    mns = _positive_int("max-num-seqs", opts.get("max_num_seqs"))
    if (mnbt or mns) and not (opts.get("engine") and get_adapter(opts["engine"]).memory.profile_settings):
        given = " and ".join(f"--{k}" for k, v in (("max-num-batched-tokens", mnbt), ("max-num-seqs", mns)) if v)
        raise BadInput(f"{given}: vLLM's profile settings, used by the engine-aware column; add --engine vllm")
    kvb = _positive_int("kv-cache-memory-bytes", opts.get("kv_cache_memory_bytes"))
    if kvb and not (opts.get("engine") and get_adapter(opts["engine"]).memory.profile_settings):
        raise BadInput("--kv-cache-memory-bytes is vLLM's setting (it replaces vLLM's memory profile); "
                       + (f"{opts['engine']} has no such flag" if opts.get("engine") else "add --engine vllm"))
    if opts.get("arm"):
        arms = with_baseline([parse_arm_spec(a) for a in opts["arm"]])
    elif shape.checkpoint is not None and shape.checkpoint.weight_format:
        arms = checkpoint_arms(shape.checkpoint.weight_format)  # a pre-quantized checkpoint serves its own format
    elif shape.checkpoint is not None:
        # a 16-bit checkpoint: the arms an engine can make from it at load time (no 4-bit: that is another repo)
        arms = with_baseline([parse_arm_spec(n) for n in ("bf16", "fp8", "fp8-kv", "int8")])
    else:
        arms = default_arms()
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise BadInput(f"--arm given twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    return capacity.PlanRequest(
        shape=shape, memory_bytes=float(memory), memory_label=label, arms=tuple(arms), util=util,
        overhead_bytes=float(overhead), tp=tp, context_len=ctx, engine=opts.get("engine"), gpu_name=gpu_name,
        decimal=decimal, max_num_batched_tokens=mnbt, max_num_seqs=mns, kv_cache_memory_bytes=kvb,
    )


def checkpoint_arms(weight_format: str) -> list[Any]:
    """The arms a pre-quantized checkpoint can serve: its weights with the model's KV, and with FP8 KV."""
    from quantrack.arms import make_arm, with_baseline

    return with_baseline([make_arm(weight_format, weights=weight_format),
                          make_arm(f"{weight_format}-kv-fp8", weights=weight_format, kv="fp8")])


def render_rows(req: Any, rows: list[Any], fmt: str) -> str:
    from quantrack.render import render

    if fmt in ("json", "csv"):
        return render([r.to_dict() for r in rows], fmt)
    scale, unit = (1e9, "GB") if req.decimal else (1024**3, "GiB")
    base = rows[0].arm
    table = []
    for r in rows:
        d: dict[str, Any] = {
            "arm": r.arm, "weights / KV": f"{r.weights_format} / {r.kv_dtype}",
            f"weights ({unit})": f"{r.weights_bytes / scale:.2f}",
            f"KV budget ({unit})": f"{r.kv_budget_bytes / scale:.2f}",
            "KV bytes/token": f"{r.kv_bytes_per_token:,.0f}",
            "token capacity": f"{r.token_capacity:,}" if r.fits else "DOES NOT FIT",
            f"concurrent @{r.context_len}": f"{r.concurrency:.2f}" if r.fits else "-",
            f"vs {base}": f"{r.vs_baseline:.2f}x" if r.vs_baseline is not None and r.fits else "-",
        }
        if req.engine:
            d[f"{req.engine} tokens (engine-aware)"] = f"{r.engine_tokens:,}" if r.engine_tokens else "DOES NOT FIT"
        d["notes"] = "; ".join(r.notes)
        table.append(d)
    if not any(d["notes"] for d in table):
        for d in table:
            d.pop("notes")
    out = render(table, "md" if fmt == "md" else "table", title=req.title() + _profile_note(req))
    from quantrack.hardware.capacity import layout_notes

    lines = [f"note: {n}" for n in layout_notes(req.shape)]
    if req.tp > 1 and rows:
        lines.append(f"note: KV bytes/token is summed over the {req.tp} TP ranks: "
                     f"{rows[0].kv_bytes_per_token / req.tp:,.0f} per rank for {rows[0].arm}")
    ckpt = req.shape.checkpoint
    if ckpt is not None:
        lines.append(f"weights from {ckpt.source}: {ckpt.total_bytes:,} B"
                     + (f"; {ckpt.skipped}" if ckpt.skipped else ""))
    return out + ("\n" + "\n".join(lines) if lines else "")


def _profile_note(req: Any) -> str:
    """For --engine vllm: the profile settings the engine-aware column assumed (given, or vLLM's defaults)."""
    if not (req.engine and get_adapter(req.engine).memory.profile_settings):
        return ""
    if req.kv_cache_memory_bytes:
        return f"; vLLM KV memory: --kv-cache-memory-bytes {req.kv_cache_memory_bytes} (no memory profile)"
    parts = [f"{name} {value if value else 'default (vLLM V1, by GPU memory)'}" for name, value in
             (("max_num_batched_tokens", req.max_num_batched_tokens), ("max_num_seqs", req.max_num_seqs))]
    return "; vLLM profile: " + ", ".join(parts)


@click.command("plan")
@model_options
@click.option("--hidden-size", metavar="INTEGER", help="Hidden size (optional). [integer ≥ 1]")
@click.option("--vocab-size", metavar="INTEGER", help="Vocabulary size (optional). [integer ≥ 1]")
@click.option("--vram", metavar="MEMORY", help="Memory per GPU: 24 (= GiB), 24GiB, 16GB (decimal), 512MiB.")
@click.option("--gpu", metavar="NAME", help="Catalog GPU (see `quantrack catalog gpus`); uses its device-reported memory.")
@setting_option(GpuSpec, "count", name="tp", default=None, help="Tensor-parallel size (default 1).")
@setting_option(GpuSpec, "util", default=None,
                help=f"Fraction of memory the engine may use (default {DEFAULT_UTIL:g}).")
@click.option("--overhead", metavar="MEMORY", help="Fixed overhead subtracted from the budget (memory string, default 0).")
@setting_option(Study, "context_len", default=None,
                help="Tokens per request for the concurrency column (default 4096).")
@click.option("--arm", "arm", multiple=True, metavar="ARM",
              help="Arm preset (bf16, fp8, fp8-kv, int8, w4a16 ...) or weights=…,kv=…; repeatable.")
@click.option("--engine", type=click.Choice(GPU_ENGINE_KINDS), help="Add the engine-aware prediction column.")
@click.option("--max-num-batched-tokens", metavar="INTEGER",
              help="With --engine vllm: tokens vLLM profiles with (V0 without chunked prefill: the context length; "
                   "default: V1's default for the GPU). [integer ≥ 1]")
@click.option("--kv-cache-memory-bytes", metavar="INTEGER",
              help="With --engine vllm: KV cache bytes per GPU (vLLM's flag; replaces its memory profile). "
                   "[integer ≥ 1]")
@click.option("--max-num-seqs", metavar="INTEGER",
              help="With --engine vllm: max_num_seqs (V0 default 256; default: V1's for the GPU). [integer ≥ 1]")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "md"]), default="table",
              show_default=True)
@click.option("--hub-timeout", "hub_timeout", type=float, default=None, metavar="SECONDS",
              help="With --model ORG/NAME: seconds the Hub look-up may take in all (default 30, "
                   "$QUANTRACK_HUB_TIMEOUT); an unreachable or hung Hub is one line, exit 2.")
def plan(**opts: Any) -> None:
    """Derived capacity per arm: weights, KV budget, KV tokens, concurrency (not measured)."""
    from quantrack.hardware.capacity import run_plan

    hub_timeout = opts.pop("hub_timeout", None)
    if hub_timeout is not None:
        import math
        import os

        if not (math.isfinite(hub_timeout) and 0 < hub_timeout < 86400):
            raise BadInput(f"--hub-timeout {hub_timeout}: a number of seconds > 0")
        os.environ["QUANTRACK_HUB_TIMEOUT"] = repr(hub_timeout)
    req = build_request(opts)
    click.echo(render_rows(req, run_plan(req), opts["fmt"]))
