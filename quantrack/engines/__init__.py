"""Engine adapters by name: ``get_adapter("vllm" | "sglang" | "llamacpp")``, engine detection from
log text, and one entry point that parses a log of any engine.

Adapters are registered as module paths and imported on first use (the CLI stays fast).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path

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


# Markers that only one engine prints (taken from the real logs in ../shared/data and engine-facts §1).
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


__all__ = ["ENGINE_KINDS", "EngineAdapter", "LogEvent", "LogReport", "detect_engine", "engine_scores",
           "get_adapter", "normalize_kind", "parse_log_file", "parse_logs"]
