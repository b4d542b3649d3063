"""Whether a startup log is one run, and whether that run started: facts every engine's log shares.

Owns three things the engine parsers feed and everything downstream reads (``logs parse``, ``audit``,
``logs reconcile``):

- **Startup failures.** The error kinds that end a start (no KV memory, a negative KV budget, a KV cache too small
  for the max model length, CUDA out of memory, an allocation llama.cpp could not make, an engine core that died).
  A report with one of them is a failed run: ``extra["startup_failed"]`` is True and ``startup_failure`` names the
  first such line. A failed run has no capacity to compare with a prediction.
- **Recovered failures.** llama.cpp retries a compute-buffer allocation without pipeline parallelism
  ("compute buffer allocation failed, retrying without pipeline parallelism", tests/data/public-logs/
  llamacpp-26297-alloc-retry-no-pp.log): the allocation errors before that line did not end the start.
- **One log, one run.** A file holding two launches (two logs appended, two tracebacks pasted together) is refused,
  never read as one run: the same start line printed twice by the same process, or two startup failures minutes
  apart (a run ends at its first fatal error within seconds; a later one is another launch). Start lines are looked
  for in the first 4 MiB block of a file (a launch prints them at once); a second launch past it is not seen.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Any

from quantrack.engines.base import LogEvent, LogReport
from quantrack.engines.logparse import Line, ReportBuilder, RuleSpec, startup_only

# error kinds that end a start (each engine's parser emits them; the generic "error" kind does not count: a line at
# ERROR level can be a warning a program printed at the wrong level)
FATAL_KINDS: frozenset[str] = frozenset({
    # vLLM
    "no_kv_memory", "negative_kv_budget", "kv_cache_too_small", "max_model_len_exceeds_kv", "oom",
    "bf16_unsupported_error", "min_capability_error", "insufficient_free_memory", "unknown_quantization",
    "engine_core_failed", "no_kernel",
    # SGLang
    "kv_scale_load_error", "scheduler_init_failed",
    # llama.cpp
    "cuda_malloc_failed", "kv_cache_init_failed", "compute_buffer_alloc_failed", "context_creation_failed",
    "model_load_failed", "quantized_v_cache_needs_flash_attn", "unsupported_cache_type", "ggml_assert",
})
# where in the start each failure happens: checks made before the weights load (the GPU, the dtype, the method, free
# memory), and the KV sizing / allocation made after them (vLLM's profile run and KV check, llama.cpp's context);
# the rest (an OOM without its phase, an engine core that died, a bare cudaMalloc failure) can be either
BEFORE_LOAD_KINDS: frozenset[str] = frozenset({
    "bf16_unsupported_error", "min_capability_error", "insufficient_free_memory", "unknown_quantization",
    "no_kernel", "model_load_failed", "quantized_v_cache_needs_flash_attn", "unsupported_cache_type"})
AFTER_LOAD_KINDS: frozenset[str] = frozenset({
    "no_kv_memory", "negative_kv_budget", "kv_cache_too_small", "max_model_len_exceeds_kv", "kv_cache_init_failed",
    "compute_buffer_alloc_failed", "context_creation_failed", "kv_scale_load_error"})
# failures raised after the engine sized its KV cache, by a check of that size (V0 "The model's max seq len (N) is
# larger than the maximum number of tokens that can be stored in KV cache (M)", V1 "... KV cache is needed, which
# is larger than the available KV cache memory"): the sized cache is measured even though the start failed
SIZED_BEFORE_FAILURE: frozenset[str] = frozenset({"max_model_len_exceeds_kv", "kv_cache_too_small"})
# allocation errors a later "retrying without pipeline parallelism" line recovers from (llama.cpp sched_reserve)
RECOVERABLE_KINDS: frozenset[str] = frozenset({"cuda_malloc_failed", "compute_buffer_alloc_failed"})

# Lines a launch prints once per process: seen twice from the same process, the file holds two launches. Each
# engine's module lists its own as (keyword, line start, label), the keyword one its parser already searches for (one
# block search per keyword, shared): vllm.START_LINES, sglang.START_LINES, llamacpp.START_LINES.
StartLine = tuple[str, str, str]
_VLLM_TS = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
_SGLANG_TS = re.compile(r"^\[(?:\d{4}-(\d\d)-(\d\d) )?(\d\d):(\d\d):(\d\d)")
RELAUNCH_GAP_S = 300  # two startup failures further apart than this are two launches


def _minutes(raw: str) -> float | None:
    m = _VLLM_TS.search(raw[:400]) or _SGLANG_TS.search(raw)
    if not m:
        return None
    mo, d, hh, mm, ss = (int(x) if x else 0 for x in m.groups())
    return ((mo * 31 + d) * 24 + hh) * 3600 + mm * 60 + ss


def _start(text: str, label: str):  # type: ignore[no-untyped-def]
    def handler(b: ReportBuilder, ln: Line) -> None:
        if not ln.text.lstrip().startswith(text) and not (label == "vLLM engine banner" and text in ln.text):
            return
        starts = b.report.extra.setdefault("_run_starts", [])
        if len(starts) < 64:
            starts.append((label, ln.rank or "", ln.no, ln.raw.strip()[:200]))
    return handler


def run_rules(start_lines: tuple[StartLine, ...]) -> list[RuleSpec]:
    """The rules recording an engine's start lines (``settle`` reads what they record)."""
    return [(kw, _start(text, label), startup_only(1)) for kw, text, label in start_lines]


def startup_failure(report: LogReport) -> LogEvent | None:
    """The first error that ended the start, or None when the log shows none. A traceback's source line ('raise
    ValueError("No available memory ...')") is passed over for the message line of the same kind that follows it."""
    fatal = [e for e in report.errors if e.kind in FATAL_KINDS]
    if not fatal:
        return None
    first = fatal[0]
    if "raise " in first.line:
        return next((e for e in fatal if e.kind == first.kind and "raise " not in e.line), first)
    return first


def failure_phase(event: LogEvent, report: LogReport, loaded: bool = False) -> str:
    """'before load', 'after load' or 'unknown': where in the start the failure happened. From the failure's kind,
    or any later failure's (a cudaMalloc failure followed by "failed to allocate compute buffers"), an OOM after the
    profile run began (vLLM's ``oom_phase``), or ``loaded``: the log shows figures printed once the weights are
    loaded (KV buffers, block counts) before it failed."""
    if event.kind in BEFORE_LOAD_KINDS:
        return "before load"
    kinds = {e.kind for e in report.errors if e.kind in FATAL_KINDS}
    if kinds & AFTER_LOAD_KINDS or loaded or (event.kind == "oom" and report.extra.get("oom_phase") == "profiling"):
        return "after load"
    return "unknown"


def failure_text(event: LogEvent) -> str:
    return f"{event.kind} at line {event.line_no}: {event.line.strip()[:160]}"


def settle(report: LogReport) -> dict[str, Any] | None:
    """After a parse: move recovered allocation errors out of ``errors``, set ``startup_failed`` and ``runs_in_file``,
    and return why the file holds more than one run (None when it holds one)."""
    ex = report.extra
    retry = next((w for w in report.warnings if w.kind == "alloc_retried_without_pp"), None)
    if retry is not None:
        kept: list[LogEvent] = []
        recovered: list[LogEvent] = []
        for e in report.errors:
            alloc = e.kind in RECOVERABLE_KINDS or (e.kind == "error" and "alloc" in e.line)
            (recovered if alloc and e.line_no < retry.line_no else kept).append(e)
        if recovered:
            report.errors = kept
            ex["recovered_errors"] = [f"{e.kind}@{e.line_no}" for e in recovered]
    fatal = startup_failure(report)
    ex["startup_failed"] = fatal is not None
    if fatal is not None:
        ex["startup_failure"] = failure_text(fatal)
    second = _second_run(report)
    ex["runs_in_file"] = 2 if second else 1
    ex.pop("_run_starts", None)
    if second is not None:  # said in the report; quantrack.engines.parse_log_file refuses such a file
        report.warnings.append(LogEvent(kind="multiple_runs", line_no=int(second["line"]), line=second["why"]))
    return second


def _second_run(report: LogReport) -> dict[str, Any] | None:
    seen: dict[tuple[str, str], int] = {}
    for label, proc, no, _line in report.extra.get("_run_starts", []):
        key = (label, proc)
        if key in seen and seen[key] != no:
            return {"line": no, "why": f"a second {label} at line {no} (the first at line {seen[key]})"}
        seen[key] = no
    fatal = [e for e in report.errors if e.kind in FATAL_KINDS]
    for first, later in pairwise(fatal):
        t0, t1 = _minutes(first.line), _minutes(later.line)
        if t0 is not None and t1 is not None and abs(t1 - t0) > RELAUNCH_GAP_S:
            gap = round(abs(t1 - t0) / 60)
            return {"line": later.line_no,
                    "why": (f"a second startup failure at line {later.line_no} ({later.kind}), {gap} min after the "
                            f"one at line {first.line_no} ({first.kind})")}
    return None


__all__ = ["FATAL_KINDS", "failure_phase", "failure_text", "run_rules", "settle", "startup_failure"]
