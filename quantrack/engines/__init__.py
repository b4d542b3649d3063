"""Engine adapters by name: ``get_adapter("vllm" | "sglang" | "llamacpp")``, engine detection from
log text, and one entry point that parses a log of any engine.

Adapters are registered as module paths and imported on first use (the CLI stays fast).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantrack.arms import Arm
from quantrack.engines.base import EngineAdapter, LogEvent, LogReport
from quantrack.errors import BadInput, NotFound, did_you_mean

_REGISTRY: dict[str, tuple[str, str]] = {
    "vllm": ("quantrack.engines.vllm", "VllmAdapter"),
    "sglang": ("quantrack.engines.sglang", "SglangAdapter"),
    "llamacpp": ("quantrack.engines.llamacpp", "LlamacppAdapter"),
}
ENGINE_KINDS: tuple[str, ...] = tuple(_REGISTRY)
_ALIASES = {"llama.cpp": "llamacpp", "llama-cpp": "llamacpp", "llama_cpp": "llamacpp", "xllamacpp": "llamacpp",
            "sgl": "sglang"}


def normalize_kind(kind: str) -> str:
    k = kind.strip().lower()
    k = _ALIASES.get(k, k)
    if k not in _REGISTRY:
        raise NotFound(f"unknown engine {kind!r}{did_you_mean(k, ENGINE_KINDS)}; known: {', '.join(ENGINE_KINDS)}")
    return k


def get_adapter(kind: str) -> EngineAdapter:
    """The adapter registered under ``kind``; unknown kinds list the known ones (BadInput)."""
    module, attr = _REGISTRY[normalize_kind(kind)]
    cls = getattr(importlib.import_module(module), attr)
    adapter: EngineAdapter = cls()
    return adapter


# Markers that only one engine prints (taken from the real logs in the project reference data and engine-facts §1).
_MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("LLM engine (v", "[kv_cache_utils.py", "[gpu_worker.py", "(EngineCore", "(APIServer",
             "KV cache size:", "Model loading took", "Loading model weights took", "# GPU blocks:",
             "vllm.entrypoints", "[model_runner.py", "Available KV cache memory"),
    "sglang": ("server_args=ServerArgs(", "max_total_num_tokens=", "Load weight end.", "KV Cache is allocated",
               "sglang.launch_server", "Memory pool end.", "Capture cuda graph", "CUDA graph end."),
    "llamacpp": ("llama_model_loader:", "print_info:", "load_tensors:", "llama_kv_cache", "llama_context:",
                 "ggml_", "srv    load_model", "gguf"),
}


def engine_scores(text: str) -> dict[str, int]:
    """How many distinct markers of each engine occur in ``text``."""
    return {k: sum(1 for m in marks if m in text) for k, marks in _MARKERS.items()}


def detect_engine(text: str) -> str | None:
    """The engine whose markers dominate ``text`` (None when none is recognisable)."""
    scores = engine_scores(text)
    best = max(scores, key=lambda k: scores[k])
    return best if scores[best] > 0 else None


DETECT_BYTES = 512 * 1024


def _head(path: Path) -> str:
    with open(path, "rb") as fh:
        return fh.read(DETECT_BYTES).decode("utf-8", errors="replace")


def parse_log_file(path: str | Path, engine: str = "auto") -> LogReport:
    """Parse one startup log; ``engine='auto'`` detects it from the first 512 KiB.

    An unrecognised log gives a report with engine None and every field in not_found (never a crash);
    a log where a second engine's markers also appear gets a ``mixed_engines`` warning.
    """
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"log file not found: {path}")
    head = _head(p)
    scores = engine_scores(head)
    kind = detect_engine(head) if engine == "auto" else normalize_kind(engine)
    if kind is None:
        report = LogReport(engine=None, source=str(p))
        report.not_found = ["engine", "weights_gib", "available_kv_gib", "kv_cache_tokens", "max_concurrency",
                            "quantization", "kv_cache_dtype"]
        report.extra["detected"] = "no engine markers found"
        return report
    report = get_adapter(kind).parse_log_file(p)
    others = [k for k, s in scores.items() if k != kind and s >= 2]
    if others:
        report.warnings.append(LogEvent(kind="mixed_engines", line_no=0,
                                        line=f"markers of {', '.join(others)} also found in this log"))
    return report


def parse_logs(paths: Iterable[str | Path], engine: str = "auto") -> list[LogReport]:
    return [parse_log_file(p, engine) for p in paths]


def arm_from_report(report: LogReport) -> Arm:
    """The arm a log describes: weights from its quantization, KV dtype from its KV-cache dtype."""
    from quantrack.arms import make_arm

    quant = (report.quantization or "none").lower()
    kv_raw = (report.kv_cache_dtype or "auto").lower()
    if report.engine == "llamacpp":
        weights = quant if quant in ("f32", "f16", "bf16", "q8_0", "q6_k", "q5_0", "q5_1", "q5_k", "q4_0",
                                     "q4_1", "q4_k", "iq4_nl") else "f16"
        kv = kv_raw if "," not in kv_raw and kv_raw != "f16" else "auto"
        return make_arm(f"{weights}-kv-{kv}" if kv != "auto" else weights, weights=weights, kv=kv,
                        dtype="auto")
    weights = {"none": (report.dtype or "bf16"), "fp8": "fp8", "w8a8_int8": "int8", "awq": "w4a16",
               "awq_marlin": "w4a16", "gptq": "w4a16", "gptq_marlin": "w4a16"}.get(quant, quant)
    kv = "auto" if kv_raw in ("auto", "bf16", "fp16", report.dtype or "bf16") else kv_raw
    quantization = None if quant == "none" else quant
    return make_arm(None, weights=weights, kv=kv, quantization=quantization)


def _err_pct(pred: float | None, actual: float | None) -> float | None:
    if pred is None or actual in (None, 0):
        return None
    return round(100.0 * (float(pred) - float(actual)) / float(actual), 2)


def reconcile(path: str | Path, model: str, gpu: str | None = None, util: float | None = None,
              context_len: int | None = None, engine: str = "auto", tp: int | None = None, *,
              vram: str | float | None = None, max_num_batched_tokens: int | None = None,
              max_num_seqs: int | None = None) -> dict[str, Any]:
    """The engine-aware plan prediction (quantrack.capacity.predict_for_arm) beside what the log reports.

    Rows: figure, predicted (derived), log (measured by the engine), error % = (predicted - log) / log.
    Device memory, first found: ``vram`` (a memory string, e.g. "23.58GiB"); the total the log reports
    (vLLM V0's ``total_gpu_memory=23.58GiB``: what the engine sized from); the catalog GPU's ``gpu``.
    ``max_num_batched_tokens`` / ``max_num_seqs``: the settings vLLM profiled with (None: its defaults).
    """
    from quantrack.capacity import GiB, predict_for_arm
    from quantrack.catalog import get_gpu
    from quantrack.hub import resolve_model

    for name, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs)):
        if value is not None and value < 1:
            raise BadInput(f"{name} must be >= 1, got {value}")
    report = parse_log_file(path, engine)
    if report.engine is None:
        raise BadInput(f"{path}: no engine recognised in this log; pass --engine")
    if report.engine != "vllm" and (max_num_batched_tokens or max_num_seqs):
        raise BadInput(f"--max-num-batched-tokens / --max-num-seqs are vLLM's profile settings; this is a "
                       f"{report.engine} log")
    if report.engine == "vllm":  # the settings the log says it ran with ("non-default args"), unless given
        max_num_batched_tokens = max_num_batched_tokens or report.extra.get("max_num_batched_tokens")
        max_num_seqs = max_num_seqs or report.extra.get("max_num_seqs")
    shape = resolve_model(model)  # a catalog name, or ORG/NAME[@REV] from the Hub (headers)
    arm = arm_from_report(report)
    ctx = context_len or report.max_concurrency_context or report.extra.get("max_model_len") \
        or report.extra.get("n_ctx")
    catalog_gpu = get_gpu(gpu) if gpu else None
    logged_total = report.extra.get("total_gpu_memory_gib")
    device: Any
    if report.engine == "llamacpp":
        device, memory_basis = catalog_gpu or 0.0, None
    elif vram is not None:
        from quantrack.units import parse_memory

        device = float(parse_memory(vram, what="--vram"))
        memory_basis = f"{device / GiB:.2f} GiB (--vram {vram})"
    elif isinstance(logged_total, (int, float)) and logged_total > 0:
        device = float(logged_total) * GiB
        memory_basis = (f"{logged_total:g} GiB: the device total the log reports (total_gpu_memory), what the "
                        "engine sized from")
        if catalog_gpu is not None:
            memory_basis += f"; not the catalog's {catalog_gpu.total_bytes / GiB:.2f} GiB for {catalog_gpu.name}"
    elif catalog_gpu is not None:
        device, memory_basis = catalog_gpu, catalog_gpu.memory_basis
    else:
        raise BadInput("--gpu is required for a GPU engine's log (e.g. --gpu H200)")  # or --vram
    if util is None:
        util = report.extra.get("gpu_memory_utilization") or report.extra.get("mem_fraction_static")
    tp = tp or report.extra.get("tensor_parallel_size") or report.extra.get("tp_size") or 1
    pred = predict_for_arm(shape, device, arm, report.engine, util=util, context_len=ctx, tp=int(tp),
                           max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                           gpu_name=catalog_gpu.name if catalog_gpu is not None else None)
    rows: list[dict[str, Any]] = []

    def row(figure: str, predicted: Any, logged: Any, unit: str) -> None:
        rows.append({"figure": figure, "unit": unit, "predicted": predicted, "log": logged,
                     "error_pct": _err_pct(predicted, logged)})

    if report.engine == "llamacpp":
        row("kv_cache_tokens", pred.get("engine_tokens"), report.kv_cache_tokens, "tokens")
        row("kv_mib", pred.get("engine_kv_mib"), report.extra.get("kv_mib"), "MiB")
        row("weights_gib", pred.get("weights_naive_gib"), report.weights_gib, "GiB")
    else:
        row("kv_cache_tokens", pred.get("engine_tokens"), report.kv_cache_tokens, "tokens")
        row("available_kv_gib", pred.get("engine_kv_gib"), report.available_kv_gib, "GiB")
        row("weights_gib", pred.get("engine_weights_gib"), report.weights_gib, "GiB")
        row("max_concurrency", pred.get("engine_max_concurrency"), report.max_concurrency, "x")
    return {"log": str(path), "engine": report.engine, "arm": arm.to_dict(), "model": shape.name,
            "gpu": catalog_gpu.name if catalog_gpu is not None else None, "memory_basis": memory_basis,
            "memory_gib": round(float(getattr(device, "total_bytes", device)) / GiB, 4) if memory_basis else None,
            "settings": {k: pred["prediction"]["settings"].get(k) for k in ("max_num_batched_tokens", "max_num_seqs")
                         if k in pred["prediction"]["settings"]} if report.engine == "vllm" else {},
            "context_len": ctx, "util": util, "rows": rows,
            "prediction": pred, "basis": {"predicted": "derived", "log": "measured (engine log)"}}


__all__ = [
    "ENGINE_KINDS",
    "EngineAdapter",
    "LogEvent",
    "LogReport",
    "arm_from_report",
    "detect_engine",
    "engine_scores",
    "get_adapter",
    "normalize_kind",
    "parse_log_file",
    "parse_logs",
    "reconcile",
]
