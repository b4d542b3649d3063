"""What a startup log establishes, and the capacity reconciliation: the engine-aware prediction
(quantrack.hardware.capacity) beside the log's figures, per rank and in total (``quantrack logs reconcile``).

The arm comes from the engine's adapter (``EngineAdapter.establish_arm``); the parallel layout from the sizes the
log states or the ranks in its process prefixes; the rows from the adapter's capacity facts (a GPU memory share
with TP/DP ranks, or parallel slots). Nothing here names an engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantrack.arms import Arm
from quantrack.engines import ENGINE_KINDS, get_adapter, parse_log_file, unclear_engine_message
from quantrack.engines.base import EngineAdapter, LogReport
from quantrack.errors import BadInput


def establish_arm(report: LogReport) -> tuple[Arm | None, str]:
    """The arm (weights x KV dtype) the log establishes, or None and why not: only lines that name the weights'
    format count (each adapter's ``establish_arm``)."""
    if report.engine is None or report.engine not in ENGINE_KINDS:
        return None, "the engine is not established"
    return get_adapter(report.engine).establish_arm(report)


def arm_from_report(report: LogReport) -> Arm:
    """The arm a log establishes (BadInput naming what is missing when it does not)."""
    arm, why = establish_arm(report)
    if arm is None:
        raise BadInput(f"arm unknown: {why}; pass --arm")
    return arm


def parallel_from_report(report: LogReport) -> dict[str, dict[str, Any]]:
    """Tensor / pipeline / data parallel sizes the log states, each with where it was read.

    Stated sizes (vLLM's banner or non-default args, SGLang's server_args, vLLM's "rank r in world size w") win over
    the process prefixes; from prefixes the size is the highest rank seen + 1 (exact when every rank printed its
    startup lines, a lower bound for an excerpt)."""
    ex = report.extra
    out: dict[str, dict[str, Any]] = {}
    for dim, keys in (("tp", ("tensor_parallel_size", "tp_size")), ("pp", ("pipeline_parallel_size", "pp_size")),
                      ("dp", ("data_parallel_size", "dp_size"))):
        for key in keys:
            if isinstance(ex.get(key), int) and ex[key] > 0:
                out[dim] = {"size": ex[key], "source": ex.get(f"{key}_source") or f"{key} in the log"}
                break
        else:
            seen = ex.get(f"{dim}_size_seen")
            if isinstance(seen, int) and seen > 0:
                # a rank id is not the size: the highest rank + 1 is a lower bound (an excerpt may lack higher ranks)
                out[dim] = {"size": seen, "bound": "lower", "source": f"{dim.upper()} ranks in the log's process "
                                                                      f"prefixes (highest rank + 1: at least {seen})"}
    if "tp" not in out and isinstance(ex.get("world_size"), int):
        pp = out.get("pp", {}).get("size", 1)
        dp = out.get("dp", {}).get("size", 1)
        out["tp"] = {"size": ex["world_size"] // (pp * dp), "source": "world_size in the log / (pp x dp)"}
    return out


def _err_pct(pred: float | None, actual: float | None) -> float | None:
    if pred is None or actual in (None, 0):
        return None
    return round(100.0 * (float(pred) - float(actual)) / float(actual), 2)


# layouts the capacity model does not cover: a word in the shape's "unsupported" notes, or a line in the log
_UNMODELLED_SHAPE = ("sliding_window", "sliding window", "mla", "multi-head latent", "linear attention", "mamba",
                     "hybrid")


def _unmodelled(report: LogReport, shape: Any, dp: int) -> str | None:
    notes = [u for u in getattr(shape, "unsupported", ()) if any(w in u.lower() for w in _UNMODELLED_SHAPE)]
    if notes:
        return f"the model's layout is not modelled ({'; '.join(notes)})"
    ex = report.extra
    if ex.get("mamba_cache") or ex.get("kv_cells_swa") or ex.get("kv_cells_non_swa"):
        what = "a Mamba/linear-attention state cache" if ex.get("mamba_cache") else "a sliding-window (iSWA) KV cache"
        return f"the log shows {what}, which the capacity model does not cover"
    if ex.get("kv_pools"):
        pools = ", ".join(f"{p['kind']} {p['tokens']} tokens" for p in ex["kv_pools"])
        return (f"the log shows hybrid KV pools ({pools}); the capacity model predicts one full-attention pool, so "
                "it is not compared with either")
    if ex.get("mla_attn") or "kv_lora_rank" in str(ex.get("k_type", "")):
        return "the log shows an MLA cache (latent KV), which the capacity model does not cover"
    moe = any("expert" in u.lower() for u in getattr(shape, "unsupported", ())) or bool(
        getattr(shape, "extra", {}).get("num_experts"))
    if ex.get("enable_dp_attention"):
        return "SGLang's DP attention (enable_dp_attention=True) is not modelled"
    if dp > 1 and moe:
        return f"MoE with data parallelism (dp {dp}: DP attention / expert parallel) is not modelled"
    return None


@dataclass
class ReconcileRow:
    """One figure: predicted (derived) beside the log's (measured), error % = (predicted - log) / log."""

    figure: str
    scope: str
    unit: str
    predicted: Any
    log: Any
    error_pct: float | None


@dataclass
class Reconciliation:
    """``reconcile``'s result; ``to_dict()`` is the JSON ``quantrack logs reconcile --format json`` prints."""

    log: str
    engine: str
    arm: Arm
    arm_source: str
    model: str
    gpu: str | None
    memory_basis: str | None
    memory_gib: float | None
    parallel: dict[str, int]
    parallel_basis: dict[str, str]
    settings: dict[str, Any]
    context_len: Any
    util: Any
    rows: list[ReconcileRow] = field(default_factory=list)
    engine_evidence: list[dict[str, Any]] = field(default_factory=list)
    prediction: dict[str, Any] = field(default_factory=dict)
    basis: dict[str, str] = field(default_factory=dict)
    startup_failure: str | None = None  # compared although the start failed (--sized-before-failure): the failure
    gpus: int | None = None  # the GPUs the engine's own layout puts the log's ranks on, where the log states it

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["arm"] = self.arm.to_dict()
        out["rows"] = [asdict(r) for r in self.rows]
        return out


def _check_flags(adapter: EngineAdapter, report: LogReport, **flags: int | None) -> None:
    if not adapter.memory.profile_settings and (flags["max_num_batched_tokens"] or flags["max_num_seqs"]):
        raise BadInput(f"--max-num-batched-tokens / --max-num-seqs are vLLM's profile settings; this is a "
                       f"{report.engine} log")
    if not adapter.memory.slots and flags["slots"]:
        raise BadInput(f"--slots is llama.cpp's -np; this is a {report.engine} log")


_BOUND = "lower bound: "


def _no_bounds(sizes: dict[str, int], basis: dict[str, str]) -> None:
    for dim, why in basis.items():
        if why.startswith(_BOUND):
            raise BadInput(f"{dim} unknown: the log states no {dim} size, only {why.removeprefix(_BOUND)}; a lower "
                           f"bound is not the size: pass --{dim}")


def _layout(report: LogReport, adapter: EngineAdapter, flags: dict[str, int | None]
            ) -> tuple[dict[str, int], dict[str, str]]:
    """TP/PP/DP sizes from the flags or the log (disagreeing is BadInput), each with its basis."""
    layout = parallel_from_report(report)
    sizes: dict[str, int] = {}
    layout_basis: dict[str, str] = {}
    for dim, flag in flags.items():
        logged = layout.get(dim)
        stated = logged is not None and "prefixes" not in logged["source"]
        if flag is not None and stated and logged is not None and logged["size"] != flag:
            raise BadInput(f"--{dim} {flag}, but the log says {dim} {logged['size']} ({logged['source']})")
        if flag is not None and logged is not None and not stated and flag < logged["size"]:
            raise BadInput(f"--{dim} {flag}, but the log shows ranks up to {logged['size'] - 1} ({logged['source']})")
        if flag is not None:
            sizes[dim], layout_basis[dim] = flag, f"--{dim}"
        elif logged is not None and logged.get("bound") == "lower" and dim != "pp" and logged["size"] > 1:
            # ranks up to N-1 prove N or more ranks, not N: a bound is never used as the value (refused by
            # _no_bounds once the layout checks ran; pp > 1 is refused whatever its value)
            sizes[dim], layout_basis[dim] = int(logged["size"]), f"{_BOUND}{logged['source']}"
        elif logged is not None:
            sizes[dim], layout_basis[dim] = int(logged["size"]), logged["source"]
        else:
            sizes[dim], layout_basis[dim] = 1, "assumed 1: the log names no size (pass --" + dim + ")"
    if adapter.memory.slots:  # one process, its KV cache split into slots: no rank layout
        sizes["tp"], sizes["pp"], sizes["dp"] = 1, 1, 1
    if sizes["pp"] > 1:
        raise BadInput(f"pipeline parallelism (pp {sizes['pp']}: {layout_basis['pp']}) is not modelled: the layer "
                       "split per stage is not in the capacity model")
    return sizes, layout_basis


def _device(report: LogReport, catalog_gpu: Any, vram: str | float | None) -> tuple[Any, str]:
    """A GPU engine's device memory and where it came from: ``vram``, the log's total, the catalog GPU."""
    from quantrack.hardware.capacity import GiB

    logged_total = report.extra.get("total_gpu_memory_gib")
    if vram is not None:
        from quantrack.hardware.units import parse_memory

        device = float(parse_memory(vram, what="--vram"))
        return device, f"{device / GiB:.2f} GiB (--vram {vram})"
    if isinstance(logged_total, (int, float)) and logged_total > 0:
        basis = (f"{logged_total:g} GiB: the device total the log reports (total_gpu_memory), what the "
                 "engine sized from")
        if catalog_gpu is not None:
            basis += f"; not the catalog's {catalog_gpu.total_bytes / GiB:.2f} GiB for {catalog_gpu.name}"
        return float(logged_total) * GiB, basis
    if catalog_gpu is not None:
        return catalog_gpu, catalog_gpu.memory_basis
    raise BadInput("--gpu is required for a GPU engine's log (e.g. --gpu H200)")  # or --vram


def _failure_check(report: LogReport, name: str, sized_before_failure: bool) -> str | None:
    """A failed start is not a capacity: BadInput naming the failure, unless the start failed a check of the KV cache
    the engine had sized and ``sized_before_failure`` asks to compare that cache. The failure text, or None."""
    from quantrack.engines.runcheck import SIZED_BEFORE_FAILURE, startup_failure

    failure = report.extra.get("startup_failure") if report.extra.get("startup_failed") else None
    if not failure:
        if sized_before_failure:
            raise BadInput(f"--sized-before-failure: {name} shows no failed start")
        return None
    fatal = startup_failure(report)
    sized = fatal is not None and fatal.kind in SIZED_BEFORE_FAILURE and bool(
        report.kv_cache_tokens or (report.available_kv_gib or 0) > 0)
    if not sized_before_failure:
        hint = "; the engine sized its KV cache before refusing: --sized-before-failure compares that cache" if sized \
            else ""
        raise BadInput(f"cannot reconcile {name}: the run failed at startup ({failure}); a start that failed has no "
                       f"capacity to compare{hint}")
    if not sized:
        raise BadInput(f"--sized-before-failure: {name} failed before its KV cache was sized ({failure}); there is no "
                       "cache to compare")
    return str(failure)


def _row(figure: str, scope: str, predicted: Any, logged: Any, unit: str) -> ReconcileRow:
    return ReconcileRow(figure, scope, unit, predicted, logged, _err_pct(predicted, logged))


def _times(v: Any, n: int) -> Any:
    return None if v is None else round(float(v) * n, 4)


def _slot_rows(report: LogReport, shape: Any, arm: Arm, slots: int | None, context_len: int | None,
               name: str) -> tuple[list[ReconcileRow], dict[str, Any], dict[str, int], dict[str, str], Any]:
    """An engine whose KV cache is split into slots (llama.cpp -np): all slots together, and the weights."""
    from quantrack.hardware.capacity import GiB, predict_engine

    assert report.engine is not None
    n_slots = slots or report.extra.get("n_slots") or report.extra.get("kv_streams") or 1
    slot_basis = ("--slots" if slots else "the log's slot count" if report.extra.get("n_slots")
                  else "the log's KV streams" if report.extra.get("kv_streams") else "assumed 1 (pass --slots)")
    # the context the log states (n_ctx, kv_size, n_ctx_seq x n_seq_max, slot n_ctx x slots), never the model's
    # training context: without one there is nothing to predict at
    n_ctx = context_len or report.extra.get("context")
    if not n_ctx:
        raise BadInput(f"cannot reconcile {name}: context {report.extra.get('context_source') or 'unknown'}; pass "
                       "--context-len")
    unified = str(report.extra.get("kv_unified", "")).strip("'\"").lower() in ("true", "1")
    pe = predict_engine(shape, 1.0, arm, report.engine, context_len=n_ctx, n_parallel=int(n_slots),
                        kv_unified=unified)
    pred = {"engine_tokens": pe.engine_tokens, "engine_kv_mib": round(pe.kv_bytes / 2**20, 2),
            "weights_naive_gib": round(pe.weights_bytes / GiB, 4), "prediction": pe.to_dict()}
    rows = [_row("kv_cache_tokens", f"all {n_slots} slot(s)", pred["engine_tokens"], report.kv_cache_tokens, "tokens"),
            _row("kv_mib", f"all {n_slots} slot(s)", pred["engine_kv_mib"], report.extra.get("kv_mib"), "MiB"),
            _row("weights_gib", "model", pred["weights_naive_gib"], report.weights_gib, "GiB")]
    return rows, pred, {"slots": int(n_slots)}, {"slots": slot_basis}, n_ctx


def _rank_rows(report: LogReport, pred: dict[str, Any], sizes: dict[str, int]) -> list[ReconcileRow]:
    """A GPU engine with TP/DP ranks: per rank, per TP group, and totals (the log's per-rank figure x ranks)."""
    tp_n, dp_n = sizes["tp"], sizes["dp"]
    group = f"per TP group of {tp_n}" if tp_n > 1 else "per engine"
    rows = [_row("kv_cache_tokens", group + " (each rank holds its share of every token)", pred.get("engine_tokens"),
                 report.kv_cache_tokens, "tokens"),
            _row("available_kv_gib", "per rank", pred.get("engine_kv_gib"), report.available_kv_gib, "GiB"),
            _row("weights_gib", "per rank", pred.get("engine_weights_gib"), report.weights_gib, "GiB")]
    gpus = report.extra.get("gpus")  # the engine's own layout where the log states it (SGLang: runs on tp x pp)
    n = int(gpus) if isinstance(gpus, int) and gpus > 0 else tp_n * dp_n
    if n > 1:
        rows.append(_row("available_kv_gib", f"total over {n} ranks (log x {n}: derived)",
                         _times(pred.get("engine_kv_gib"), n), _times(report.available_kv_gib, n), "GiB"))
        rows.append(_row("weights_gib", f"total over {n} ranks (log x {n}: derived)",
                         _times(pred.get("engine_weights_gib"), n), _times(report.weights_gib, n), "GiB"))
    if dp_n > 1:
        rows.append(_row("kv_cache_tokens", f"total over {dp_n} data-parallel replicas (x {dp_n}: derived)",
                         _times(pred.get("engine_tokens"), dp_n), _times(report.kv_cache_tokens, dp_n), "tokens"))
    rows.append(_row("max_concurrency", group, pred.get("engine_max_concurrency"), report.max_concurrency, "x"))
    return rows


def reconcile(path: str | Path, model: Any, gpu: str | None = None, util: float | None = None,
              context_len: int | None = None, engine: str = "auto", tp: int | None = None, *,
              pp: int | None = None, dp: int | None = None, arm: Any = None,
              vram: str | float | None = None, max_num_batched_tokens: int | None = None,
              max_num_seqs: int | None = None, slots: int | None = None,
              sized_before_failure: bool = False) -> Reconciliation:
    """The engine-aware plan prediction (quantrack.hardware.capacity.predict_for_arm) beside what the log reports.

    ``model``: a catalog name, a Hub ORG/NAME[@REV], or a ModelShape (``--config`` / ``--gguf`` / ``--params``,
    resolved by the CLI).
    Rows: figure, scope (per rank / total), predicted (derived), log (measured by the engine), error % =
    (predicted - log) / log. The arm comes from the log's quantization lines or ``arm``; when neither establishes it
    there is no number (BadInput "arm unknown: ... pass --arm"). Parallel sizes: ``tp``/``pp``/``dp`` or the log's
    (flag and log disagreeing is BadInput); pipeline parallelism and layouts the model does not cover are refused.
    Device memory, first found: ``vram``; the total the log reports (vLLM V0's ``total_gpu_memory``); ``gpu``.
    A start that failed is not a capacity: refused with the failure, unless it failed a check of a KV cache the engine
    had sized (``sized_before_failure``). A slot engine's log that states no context is refused (``--context-len``).
    """
    from quantrack.hardware.capacity import GiB, predict_for_arm
    from quantrack.hardware.catalog import get_gpu
    from quantrack.models.hub import resolve_model

    for name, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs),
                        ("--tp", tp), ("--pp", pp), ("--dp", dp), ("--slots", slots)):
        if value is not None and value < 1:
            raise BadInput(f"{name} must be >= 1, got {value}")
    report = parse_log_file(path, engine)
    if report.engine is None:
        raise BadInput(unclear_engine_message(report))
    failure = _failure_check(report, Path(path).name, sized_before_failure)
    adapter = get_adapter(report.engine)
    _check_flags(adapter, report, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                 slots=slots)
    if adapter.memory.slots:  # one process, its KV cache split into slots, read from the log: these would be ignored
        unused = [n for n, v in (("--tp", tp), ("--pp", pp), ("--dp", dp), ("--vram", vram), ("--util", util))
                  if v is not None]
        if unused:
            raise BadInput(f"{', '.join(unused)}: not used for a {report.engine} log (one process; its KV and compute "
                           "buffers are read from the log); leave them out")
    if adapter.memory.profile_settings:  # the settings the log says it ran with ("non-default args"), unless given
        max_num_batched_tokens = max_num_batched_tokens or report.extra.get("max_num_batched_tokens")
        max_num_seqs = max_num_seqs or report.extra.get("max_num_seqs")
    # a catalog name, or ORG/NAME[@REV] from the Hub (headers); or a shape the CLI resolved (--config/--gguf/--params)
    shape = resolve_model(model) if isinstance(model, str) else model
    if arm is not None:
        arm_source = "--arm"
    else:
        arm, why = establish_arm(report)
        if arm is None:
            raise BadInput(f"arm unknown: {why}; pass --arm")
        arm_source = "the log"
    sizes, layout_basis = _layout(report, adapter, {"tp": tp, "pp": pp, "dp": dp})
    why_not = _unmodelled(report, shape, sizes["dp"])
    if why_not:
        raise BadInput(f"cannot reconcile {Path(path).name}: {why_not}")
    _no_bounds(sizes, layout_basis)
    ctx = context_len or report.max_concurrency_context or report.extra.get("max_model_len") \
        or report.extra.get("context_len") or report.extra.get("n_ctx")
    catalog_gpu = get_gpu(gpu) if gpu else None
    device: Any
    memory_basis: str | None
    if adapter.memory.slots:
        device, memory_basis = catalog_gpu or 0.0, None
    else:
        device, memory_basis = _device(report, catalog_gpu, vram)
    if util is None:
        util = report.extra.get("gpu_memory_utilization") or report.extra.get("mem_fraction_static")
    if adapter.memory.slots:
        rows, pred, sizes, layout_basis, ctx = _slot_rows(report, shape, arm, slots, context_len, Path(path).name)
    else:
        pred = predict_for_arm(shape, device, arm, report.engine, util=util, context_len=ctx, tp=sizes["tp"],
                               max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                               gpu_name=catalog_gpu.name if catalog_gpu is not None else None).to_dict()
        rows = _rank_rows(report, pred, sizes)
    return Reconciliation(
        log=str(path), engine=report.engine, arm=arm, arm_source=arm_source, model=shape.name,
        gpu=catalog_gpu.name if catalog_gpu is not None else None, memory_basis=memory_basis,
        memory_gib=round(float(getattr(device, "total_bytes", device)) / GiB, 4) if memory_basis else None,
        parallel=sizes, parallel_basis=layout_basis,
        settings={k: pred["prediction"]["settings"].get(k) for k in ("max_num_batched_tokens", "max_num_seqs")
                  if k in pred["prediction"]["settings"]} if adapter.memory.profile_settings else {},
        context_len=ctx, util=util, rows=rows, engine_evidence=report.engine_evidence,
        startup_failure=failure, gpus=report.extra.get("gpus"),
        prediction=pred, basis={"predicted": "derived", "log": "measured (engine log)"})

__all__ = ["ReconcileRow", "Reconciliation", "arm_from_report", "establish_arm", "parallel_from_report",
           "reconcile"]
