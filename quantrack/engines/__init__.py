"""Engine adapters by name: ``get_adapter("vllm" | "sglang" | "llamacpp")``, the registry (``register``), engine
detection from log text (quantrack.engines.detect: per-line marker scores, with the deciding lines), and one entry
point that parses a log of any engine with every engine's fallback catalogue, and the KV-scale plan of an arm
(``plan_scales``, the adapter's ``plan_kv_scales``). What a log establishes (the arm, the
parallel layout) and the capacity reconciliation are quantrack.engines.reconcile.

The registry itself is quantrack.engines.registry (re-exported here). Built-in adapters are registered as module
paths and imported on first use (the CLI stays fast); ``register`` adds an adapter object at run time (a plugin, the
test engine of tests/fake_engine.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.engines import base as _base
from quantrack.engines.base import EngineAdapter, LogEvent, LogReport
from quantrack.engines.registry import (
    DEFAULT_ENGINE,
    DEFAULT_UTIL,
    ENGINE_KINDS,
    GPU_ENGINE_KINDS,
    EngineKinds,
    adapters,
    get_adapter,
    normalize_kind,
    register,
    registry_generation,
    unregister,
)
from quantrack.errors import BadInput

if TYPE_CHECKING:
    from quantrack.engines.kvplan import CheckpointKV, ScalePlan

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
    import os

    from quantrack.store.files import file_kind, open_regular_read

    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{path}: is a directory, not a log file")
    if not os.path.exists(p):
        raise BadInput(f"log file not found: {path}")
    if not p.is_file():  # a FIFO would block the read, /dev/zero never ends: neither is a log
        raise BadInput(f"{path} is not a regular file ({file_kind(p.stat().st_mode)}), not a log file")
    try:
        with open_regular_read(p) as fh:
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
    """The fallback and degraded-mode rules of every engine but ``exclude`` (each adapter's ``fallback_rules``)."""
    rules: list[Any] = []
    for adapter in adapters():
        if adapter.kind != exclude:
            rules += list(adapter.fallback_rules)
    return rules


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
        report = get_adapter(kind).parse_log(FileSource(str(p)), source=str(p), extra_rules=fallback_rules(kind))
        second = next((w for w in report.warnings if w.kind == "multiple_runs"), None)
        if second is not None and strict:  # one log, one run: never read two launches as one
            raise BadInput(f"{path}: holds 2 runs ({second.line}); split it into one file per run")
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


# the adapters' parse_log_file (EngineAdapter.parse_log_file) is this function: handed to the interface module here,
# so quantrack.engines.base never imports the package that imports it
_base.parse_captured_log = parse_log_file


def plan_scales(arm: Any, engine: str, *, engine_version: str | None = None,
                checkpoint: CheckpointKV | None = None, engine_args: tuple[str, ...] = ()) -> ScalePlan | None:
    """Which k/v scales ``engine`` will use for one arm's KV cache (quantrack.engines.kvplan): its adapter decides
    (``EngineAdapter.plan_kv_scales``), and
    quantrack's own measurements of the rule it chose are attached. None for an engine whose adapter has no KV-scale
    rules; an engine not registered is BadInput naming the known ones."""
    from quantrack.engines.kvplan import KVScaleRequest, ScaleSource, flag_value, measured_for

    adapter = get_adapter(engine)
    args = (*tuple(getattr(arm, "engine_args", ()) or ()), *engine_args)
    kv = (flag_value(args, "--kv-cache-dtype") or arm.kv or "auto").lower()
    read = adapter.kv_scale_rules_version
    note = None
    if read and engine_version and engine_version != read:
        note = f"rules read from {adapter.kind} {read}; {adapter.kind} {engine_version} not checked"
    plan = adapter.plan_kv_scales(KVScaleRequest(arm, adapter.kind, kv, args, checkpoint, note))
    if plan is None:
        return None
    weights = getattr(arm, "weights", None)
    if plan.source in (ScaleSource.UNSCALED, ScaleSource.UNKNOWN):
        plan.measured = measured_for(adapter.kind, plan.kv, weights, plan.rule_id)
    elif plan.source != ScaleSource.NOT_QUANTIZED:  # computed, per-token-head, refused ...: runs of that very rule
        plan.measured = measured_for(adapter.kind, plan.kv, weights, plan.rule_id, rule_only=True)
    return plan


def parse_logs(paths: Iterable[str | Path], engine: str = "auto") -> list[LogReport]:
    return [parse_log_file(p, engine) for p in paths]


def unclear_engine_message(report: LogReport) -> str:
    """One line for a log whose engine is not clear: what came closest and what to pass."""
    det = report.detection or {}
    scores = det.get("scores") or {}
    cands = [k for k in det.get("candidates") or [] if scores.get(k)]
    src = report.source or "log"
    if not cands:
        labels = [a.label or a.kind for a in adapters()]
        named = ", ".join(labels[:-1]) + " or " + labels[-1] if len(labels) > 1 else labels[0]
        return (f"{src}: not a {named} startup log (no engine line found); "
                f"pass --engine {'|'.join(ENGINE_KINDS)} if it is one")
    listed = ", ".join(f"{k} ({scores[k]} points)" for k in cands)
    return f"{src}: engine unclear ({det.get('reason', '')}); closest: {listed}; pass --engine {cands[0]} (or another)"


__all__ = [
    "DEFAULT_ENGINE",
    "DEFAULT_UTIL",
    "ENGINE_KINDS",
    "GPU_ENGINE_KINDS",
    "EngineAdapter",
    "EngineKinds",
    "LogEvent",
    "LogReport",
    "adapters",
    "check_log_file",
    "detect_engine",
    "engine_scores",
    "fallback_rules",
    "get_adapter",
    "normalize_kind",
    "parse_log_file",
    "parse_logs",
    "plan_scales",
    "register",
    "registry_generation",
    "unclear_engine_message",
    "unregister",
]
