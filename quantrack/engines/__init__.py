"""Engine adapters by name: ``get_adapter("vllm" | "sglang" | "llamacpp")``, engine detection from
log text (quantrack.engines.detect: per-line marker scores, with the deciding lines), one entry point that parses a
log of any engine with every engine's fallback catalogue, the arm and parallel layout a log establishes, and
``reconcile`` (the capacity prediction beside the log's figures, per rank and in total).

Adapters are registered as module paths and imported on first use (the CLI stays fast).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantrack.arms import GGUF_TYPES, Arm
from quantrack.engines.base import EngineAdapter, LogEvent, LogReport
from quantrack.errors import BadInput, NotFound, did_you_mean

_REGISTRY: dict[str, tuple[str, str]] = {
    "vllm": ("quantrack.engines.vllm", "VllmAdapter"),
    "sglang": ("quantrack.engines.sglang", "SglangAdapter"),
    "llamacpp": ("quantrack.engines.llamacpp", "LlamacppAdapter"),
}
ENGINE_KINDS: tuple[str, ...] = tuple(_REGISTRY)
DEFAULT_ENGINE = "vllm"  # where a command or a study names none
# The memory share a study, a plan or a KL baseline assume where none is given: vLLM 0.25.0's
# gpu_memory_utilization default (vllm/config/cache.py:L68). The one definition.
DEFAULT_UTIL = 0.92
# the engines with a GPU memory-share model (``EngineAdapter.gpu_memory_share``), for option choices that must
# not import the adapters (a test checks the two agree)
GPU_ENGINE_KINDS: tuple[str, ...] = ("vllm", "sglang")
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


DETECT_BYTES = 512 * 1024  # kept for callers of the old head-based detection (quantrack.engines.detect reads more)


def engine_scores(text: str) -> dict[str, int]:
    """Per-engine marker scores of ``text`` (quantrack.engines.detect)."""
    from quantrack.engines.detect import detect_text

    return detect_text(text).scores


def detect_engine(text: str) -> str | None:
    """The engine a person would name for ``text``, or None when no engine is clear."""
    from quantrack.engines.detect import detect_text

    return detect_text(text).engine


# --- bad input ------------------------------------------------------------------------------------------------
_SNIFF = 8192
_CONTROL = bytes(c for c in range(32) if c not in (9, 10, 12, 13, 27))  # not text: NUL, BEL ... (tab, CR, ESC are)


def check_log_file(path: str | Path, *, strict: bool = True) -> Path:
    """The path of a readable text log, or BadInput naming what it is instead (missing, a directory, and with
    ``strict`` also empty or binary)."""
    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{path}: is a directory, not a log file")
    if not p.is_file():
        raise BadInput(f"log file not found: {path}")
    try:
        with open(p, "rb") as fh:
            head = fh.read(_SNIFF)
    except OSError as exc:
        raise BadInput(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not strict:
        return p
    if not head.strip():
        raise BadInput(f"{path}: empty file, not a startup log")
    control = len(head) - len(head.translate(None, _CONTROL))
    if b"\x00" in head or control > len(head) // 20:
        raise BadInput(f"{path}: binary file, not a text log")
    return p


# --- parse with detection and every engine's fallback catalogue ----------------------------------------------
def fallback_rules(exclude: str | None = None) -> list[Any]:
    """The fallback and degraded-mode rules of every engine but ``exclude`` (each engine module's FALLBACK_RULES)."""
    rules: list[Any] = []
    for kind in ENGINE_KINDS:
        if kind != exclude:
            rules += list(getattr(importlib.import_module(_REGISTRY[kind][0]), "FALLBACK_RULES", ()))
    return rules


_PARSERS = {"vllm": "parse_vllm_log", "sglang": "parse_sglang_log", "llamacpp": "parse_llamacpp_log"}


def parse_log_file(path: str | Path, engine: str = "auto", *, strict: bool = True) -> LogReport:
    """Parse one startup log. ``engine='auto'`` scores every engine's markers line by line
    (quantrack.engines.detect) and parses with the clear winner; the report says why (``detection``) and which lines
    decided (``engine_evidence``). Whatever the engine, the fallback and degraded-mode lines of every engine's
    catalogue are looked for in the same pass.

    No clear engine: a report with ``engine`` None, the detection's reason and candidates, the fallbacks found by
    every catalogue, and every figure in ``not_found`` (never a crash, never a guess). A missing, empty, binary file
    or a directory is BadInput; ``strict=False`` (the adapters, for a log the runner captured itself) parses an
    empty or binary file into a report of not-found fields instead.
    """
    from quantrack.engines.detect import detect_file
    from quantrack.engines.logparse import FileSource, ReportBuilder, scan

    p = check_log_file(path, strict=strict)
    det = detect_file(str(p))
    if engine == "auto":
        kind = det.engine
        detection = det.to_dict()
        evidence = det.evidence
    else:
        kind = normalize_kind(engine)
        detection = {"engine": kind, "method": "given", "scores": det.scores, "reason": f"--engine {kind}"}
        evidence = [{"engine": kind, "marker": f"--engine {kind}", "weight": None, "line_no": 0, "line": "",
                     "source": "command line"}]
    if kind is None:
        b = ReportBuilder("", str(p), ())
        scan(FileSource(str(p)), b, fallback_rules())
        report = b.finish()
        report.engine = None
        report.not_found = ["engine", "weights_gib", "available_kv_gib", "kv_cache_tokens", "max_concurrency",
                            "quantization", "kv_cache_dtype"]
        report.extra["detected"] = det.reason
        report.extra["candidates"] = det.candidates
    else:
        module = importlib.import_module(_REGISTRY[kind][0])
        report = getattr(module, _PARSERS[kind])(FileSource(str(p)), source=str(p), extra_rules=fallback_rules(kind))
        others = [k for k, sc in det.scores.items() if k != kind and sc >= 5 and sc * 2 >= det.scores.get(kind, 0)]
        if others:
            report.warnings.append(LogEvent(kind="mixed_engines", line_no=0,
                                            line=f"markers of {', '.join(others)} also found in this log"))
        if engine != "auto" and det.engine not in (None, kind):
            report.warnings.append(LogEvent(kind="engine_mismatch", line_no=0,
                                            line=f"--engine {kind}, but the log reads as {det.engine} ({det.reason})"))
    report.detection = detection
    report.engine_evidence = evidence
    return report


def parse_logs(paths: Iterable[str | Path], engine: str = "auto") -> list[LogReport]:
    return [parse_log_file(p, engine) for p in paths]


def unclear_engine_message(report: LogReport) -> str:
    """One line for a log whose engine is not clear: what came closest and what to pass."""
    det = report.detection or {}
    scores = det.get("scores") or {}
    cands = [k for k in det.get("candidates") or [] if scores.get(k)]
    src = report.source or "log"
    if not cands:
        return (f"{src}: not a vLLM, SGLang or llama.cpp startup log (no engine line found); "
                f"pass --engine {'|'.join(ENGINE_KINDS)} if it is one")
    listed = ", ".join(f"{k} ({scores[k]} points)" for k in cands)
    return f"{src}: engine unclear ({det.get('reason', '')}); closest: {listed}; pass --engine {cands[0]} (or another)"


# --- the arm and the parallel layout a log establishes --------------------------------------------------------
_VLLM_WEIGHTS = {"fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "fp8_w8a8": "fp8", "modelopt": "fp8",
                 "modelopt_fp4": "nvfp4", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "awq": "w4a16", "awq_marlin": "w4a16",
                 "w8a8_int8": "int8", "experts_int8": "int8"}
# GGUF file types the log may name -> weights: the one table (quantrack.arms.GGUF_TYPES); an MXFP4 file type
# is not read from a log yet
_GGUF_WEIGHTS = {t: t for t in GGUF_TYPES if t != "mxfp4"}
_KV_WORDS = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "fp8_e4m3fn": "fp8_e4m3",
             "nvfp4": "nvfp4", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def establish_arm(report: LogReport) -> tuple[Arm | None, str]:
    """The arm (weights x KV dtype) the log establishes, or None and why not. Only lines that name the weights'
    format count: vLLM's banner ``quantization=``, SGLang's ``--quantization`` / ``quant=`` of its load line,
    llama.cpp's GGUF file type. SGLang's ``dtype=torch.bfloat16`` is the activation dtype, and its
    ``quantization=None`` also describes a pre-quantized checkpoint, so neither establishes bf16 weights."""
    from quantrack.arms import make_arm

    quant = (report.quantization or "").strip().lower()
    kv_raw = (report.kv_cache_dtype or "auto").strip().lower()
    weights: str
    w: str | None
    if report.engine == "llamacpp":
        w = _GGUF_WEIGHTS.get(quant)
        if w is None:
            return None, (f"GGUF file type {report.quantization!r} is not one quantrack models" if quant else
                          "the log has no GGUF file type line (print_info: file type)")
        kv = kv_raw if "," not in kv_raw and kv_raw not in ("f16", "auto") else "auto"
        if "," in kv_raw:
            return None, f"K and V cache types differ ({report.kv_cache_dtype})"
        return make_arm(f"{w}-kv-{kv}" if kv != "auto" else w, weights=w, kv=kv, dtype="auto"), ""
    if report.engine not in ("vllm", "sglang"):
        return None, "the engine is not established"
    if not quant:
        where = ("no engine banner with quantization=" if report.engine == "vllm"
                 else "no server_args line with quantization=")
        return None, f"the log names no quantization ({where})"
    if quant == "none":
        if report.engine == "sglang" and not report.extra.get("quant_from_load_line"):
            return None, ("SGLang's quantization=None is printed for a pre-quantized checkpoint too, and the dtype= "
                          "of its load line is the activation dtype: the weights' format is not in the log")
        if report.dtype not in ("bf16", "fp16", "fp32"):
            return None, "unquantized, but the log names no model dtype"
        weights = str(report.dtype)
    else:
        w = _VLLM_WEIGHTS.get(quant)
        if w is None and quant == "compressed-tensors":
            kern = (report.linear_kernel or "").lower()
            w = "fp8" if "fp8" in kern else "nvfp4" if "fp4" in kern else "int8" if "int8" in kern else None
            if w is None:
                return None, "compressed-tensors checkpoint: its scheme (FP8, INT8, W4A16, NVFP4) is not in the log"
        if not w:
            return None, (f"quantization {report.quantization!r}: its bit width is not in the log" if quant.startswith(
                "gptq") else f"quantization {report.quantization!r} is not one quantrack models")
        weights = w
    act = report.extra.get("activation_dtype") or report.dtype or "bf16"
    kv_word = _KV_WORDS.get(kv_raw)
    if kv_word is None:
        return None, f"KV-cache dtype {report.kv_cache_dtype!r} is not one quantrack models"
    kv = "auto" if kv_word in ("bf16", "fp16", "fp32") and kv_word == act else kv_word
    quantization = None if quant == "none" else quant
    return make_arm(None, weights=weights, kv=kv, quantization=quantization), ""


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
                out[dim] = {"size": seen, "source": f"{dim.upper()} ranks in the log's process prefixes "
                                                    f"(highest rank + 1: at least {seen})"}
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
    if ex.get("mla_attn") or "kv_lora_rank" in str(ex.get("k_type", "")):
        return "the log shows an MLA cache (latent KV), which the capacity model does not cover"
    moe = any("expert" in u.lower() for u in getattr(shape, "unsupported", ())) or bool(
        getattr(shape, "extra", {}).get("num_experts"))
    if ex.get("enable_dp_attention"):
        return "SGLang's DP attention (enable_dp_attention=True) is not modelled"
    if dp > 1 and moe:
        return f"MoE with data parallelism (dp {dp}: DP attention / expert parallel) is not modelled"
    return None


def reconcile(path: str | Path, model: Any, gpu: str | None = None, util: float | None = None,
              context_len: int | None = None, engine: str = "auto", tp: int | None = None, *,
              pp: int | None = None, dp: int | None = None, arm: Any = None,
              vram: str | float | None = None, max_num_batched_tokens: int | None = None,
              max_num_seqs: int | None = None, slots: int | None = None) -> dict[str, Any]:
    """The engine-aware plan prediction (quantrack.capacity.predict_for_arm) beside what the log reports.

    ``model``: a catalog name, a Hub ORG/NAME[@REV], or a ModelShape (``--config`` / ``--gguf`` / ``--params``,
    resolved by the CLI).
    Rows: figure, scope (per rank / total), predicted (derived), log (measured by the engine), error % =
    (predicted - log) / log. The arm comes from the log's quantization lines or ``arm``; when neither establishes it
    there is no number (BadInput "arm unknown: ... pass --arm"). Parallel sizes: ``tp``/``pp``/``dp`` or the log's
    (flag and log disagreeing is BadInput); pipeline parallelism and layouts the model does not cover are refused.
    Device memory, first found: ``vram``; the total the log reports (vLLM V0's ``total_gpu_memory``); ``gpu``.
    """
    from quantrack.capacity import GiB, predict_engine, predict_for_arm
    from quantrack.catalog import get_gpu
    from quantrack.hub import resolve_model

    for name, value in (("--max-num-batched-tokens", max_num_batched_tokens), ("--max-num-seqs", max_num_seqs),
                        ("--tp", tp), ("--pp", pp), ("--dp", dp), ("--slots", slots)):
        if value is not None and value < 1:
            raise BadInput(f"{name} must be >= 1, got {value}")
    report = parse_log_file(path, engine)
    if report.engine is None:
        raise BadInput(unclear_engine_message(report))
    if report.engine != "vllm" and (max_num_batched_tokens or max_num_seqs):
        raise BadInput(f"--max-num-batched-tokens / --max-num-seqs are vLLM's profile settings; this is a "
                       f"{report.engine} log")
    if report.engine != "llamacpp" and slots:
        raise BadInput(f"--slots is llama.cpp's -np; this is a {report.engine} log")
    if report.engine == "vllm":  # the settings the log says it ran with ("non-default args"), unless given
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
    layout = parallel_from_report(report)
    sizes: dict[str, int] = {}
    layout_basis: dict[str, str] = {}
    for dim, flag in (("tp", tp), ("pp", pp), ("dp", dp)):
        logged = layout.get(dim)
        stated = logged is not None and "prefixes" not in logged["source"]
        if flag is not None and stated and logged is not None and logged["size"] != flag:
            raise BadInput(f"--{dim} {flag}, but the log says {dim} {logged['size']} ({logged['source']})")
        if flag is not None and logged is not None and not stated and flag < logged["size"]:
            raise BadInput(f"--{dim} {flag}, but the log shows ranks up to {logged['size'] - 1} ({logged['source']})")
        if flag is not None:
            sizes[dim], layout_basis[dim] = flag, f"--{dim}"
        elif logged is not None:
            sizes[dim], layout_basis[dim] = int(logged["size"]), logged["source"]
        else:
            sizes[dim], layout_basis[dim] = 1, "assumed 1: the log names no size (pass --" + dim + ")"
    if report.engine == "llamacpp":
        sizes["tp"], sizes["pp"], sizes["dp"] = 1, 1, 1
    if sizes["pp"] > 1:
        raise BadInput(f"pipeline parallelism (pp {sizes['pp']}: {layout_basis['pp']}) is not modelled: the layer "
                       "split per stage is not in the capacity model")
    why_not = _unmodelled(report, shape, sizes["dp"])
    if why_not:
        raise BadInput(f"cannot reconcile {Path(path).name}: {why_not}")
    ctx = context_len or report.max_concurrency_context or report.extra.get("max_model_len") \
        or report.extra.get("context_len") or report.extra.get("n_ctx")
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
    tp_n = sizes["tp"]
    rows: list[dict[str, Any]] = []
    pred: dict[str, Any]

    def row(figure: str, scope: str, predicted: Any, logged: Any, unit: str) -> None:
        rows.append({"figure": figure, "scope": scope, "unit": unit, "predicted": predicted, "log": logged,
                     "error_pct": _err_pct(predicted, logged)})

    def times(v: Any, n: int) -> Any:
        return None if v is None else round(float(v) * n, 4)

    if report.engine == "llamacpp":
        n_slots = slots or report.extra.get("n_slots") or report.extra.get("kv_streams") or 1
        slot_basis = ("--slots" if slots else "the log's slot count" if report.extra.get("n_slots")
                      else "the log's KV streams" if report.extra.get("kv_streams") else "assumed 1 (pass --slots)")
        per_slot = report.max_concurrency_context
        n_ctx = context_len or report.extra.get("n_ctx") or (int(per_slot) * int(n_slots) if per_slot else ctx)
        unified = str(report.extra.get("kv_unified", "")).strip("'\"").lower() in ("true", "1")
        pe = predict_engine(shape, 1.0, arm, "llamacpp", context_len=n_ctx, n_parallel=int(n_slots),
                            kv_unified=unified)
        pred = {"engine_tokens": pe.engine_tokens, "engine_kv_mib": round(pe.kv_bytes / 2**20, 2),
                "weights_naive_gib": round(pe.weights_bytes / GiB, 4), "prediction": pe.to_dict()}
        row("kv_cache_tokens", f"all {n_slots} slot(s)", pred["engine_tokens"], report.kv_cache_tokens, "tokens")
        row("kv_mib", f"all {n_slots} slot(s)", pred["engine_kv_mib"], report.extra.get("kv_mib"), "MiB")
        row("weights_gib", "model", pred["weights_naive_gib"], report.weights_gib, "GiB")
        layout_basis = {"slots": slot_basis}
        sizes = {"slots": int(n_slots)}
        ctx = n_ctx
    else:
        pred = predict_for_arm(shape, device, arm, report.engine, util=util, context_len=ctx, tp=tp_n,
                               max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                               gpu_name=catalog_gpu.name if catalog_gpu is not None else None)
        dp_n = sizes["dp"]
        group = f"per TP group of {tp_n}" if tp_n > 1 else "per engine"
        row("kv_cache_tokens", group + " (each rank holds its share of every token)", pred.get("engine_tokens"),
            report.kv_cache_tokens, "tokens")
        row("available_kv_gib", "per rank", pred.get("engine_kv_gib"), report.available_kv_gib, "GiB")
        row("weights_gib", "per rank", pred.get("engine_weights_gib"), report.weights_gib, "GiB")
        if tp_n * dp_n > 1:
            n = tp_n * dp_n
            row("available_kv_gib", f"total over {n} ranks (log x {n}: derived)", times(pred.get("engine_kv_gib"), n),
                times(report.available_kv_gib, n), "GiB")
            row("weights_gib", f"total over {n} ranks (log x {n}: derived)", times(pred.get("engine_weights_gib"), n),
                times(report.weights_gib, n), "GiB")
        if dp_n > 1:
            row("kv_cache_tokens", f"total over {dp_n} data-parallel replicas (x {dp_n}: derived)",
                times(pred.get("engine_tokens"), dp_n), times(report.kv_cache_tokens, dp_n), "tokens")
        row("max_concurrency", group, pred.get("engine_max_concurrency"), report.max_concurrency, "x")
    return {"log": str(path), "engine": report.engine, "arm": arm.to_dict(), "arm_source": arm_source,
            "model": shape.name, "gpu": catalog_gpu.name if catalog_gpu is not None else None,
            "memory_basis": memory_basis,
            "memory_gib": round(float(getattr(device, "total_bytes", device)) / GiB, 4) if memory_basis else None,
            "parallel": sizes, "parallel_basis": layout_basis,
            "settings": {k: pred["prediction"]["settings"].get(k) for k in ("max_num_batched_tokens", "max_num_seqs")
                         if k in pred["prediction"]["settings"]} if report.engine == "vllm" else {},
            "context_len": ctx, "util": util, "rows": rows,
            "engine_evidence": report.engine_evidence,
            "prediction": pred, "basis": {"predicted": "derived", "log": "measured (engine log)"}}


__all__ = [
    "ENGINE_KINDS",
    "EngineAdapter",
    "LogEvent",
    "LogReport",
    "arm_from_report",
    "check_log_file",
    "detect_engine",
    "engine_scores",
    "establish_arm",
    "fallback_rules",
    "get_adapter",
    "normalize_kind",
    "parallel_from_report",
    "parse_log_file",
    "parse_logs",
    "reconcile",
    "unclear_engine_message",
]
