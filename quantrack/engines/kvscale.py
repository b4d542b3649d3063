"""Which k/v scales a running engine used, from its own startup lines (the after-launch half of
``quantrack.engines.kvplan``).

Owns the KV-scale lines of vLLM and SGLang and the verdict drawn from them (``KVScaleObservation``): a
``ScaleSource`` plus the lines that decided it. The lines, as printed (format strings read in the engine code; real
examples in tests/data/logs/ and tests/data/kvscale/):

vLLM 0.25.0 (vllm@dd10e03f9):
- ``Using KV cache scaling factor 1.0 for fp8_e4m3. If this is unintended, ...`` (quantization/kv_cache.py:L147-L152)
- ``Using uncalibrated q_scale 1.0 and/or prob_scale 1.0 with fp8 attention. ...`` (kv_cache.py:L186-L192)
- ``Checkpoint does not provide a q scaling factor. Setting it to k_scale. ...`` (kv_cache.py:L133-L138)
- ``The `--calculate-kv-scales` option is deprecated and will be removed in v0.19. ...`` (config/cache.py:L263-L273)
- ``Using %s data type to store kv cache. ... Dynamic per-token-head scales will be computed at runtime.``
  (config/cache.py:L278-L285)
- ``fp8_e5m2 kv-cache is not supported with fp8 checkpoints.`` (layers/attention/attention.py:L210-L212)
- ``Found %s in the checkpoint (e.g. %s), but not found the expected name in the model (e.g. %s). %s is not
  loaded.`` (model_loader/weight_utils.py:L1438-L1444)
SGLang 0.5.16 (python/sglang/srt/...):
- ``Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of 1.0. This may lead to
  less accurate results!`` (model_executor/model_runner_components/load_model_utils.py:L103-L108)
- ``Loaded KV cache scaling factors from %s`` (same file, L92-L96)
- ``Parameter model.layers.0.self_attn.k_scale not found in params_dict`` (models/qwen2.py:L639)
- ``KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: ...`` (the KV dtype actually allocated)

vLLM prints nothing when it loads checkpoint scales, and nothing for FP8 KV on unquantized weights (no KV
quantization method exists then: scales 1.0); the verdict says which of those the log's other facts point to, or
``unknown`` with the reason.

What is one engine's own -- what its silence means, what its 'scales 1.0' line leaves out, an engine with no scale
lines at all (llama.cpp) -- is its adapter's (``EngineAdapter.observe_kv_scales``, which calls ``observe_lines`` or
reads its own report); this module names no engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from quantrack.engines.kvplan import ScaleSource

_KV_DTYPE_LINE = re.compile(r"Using (\S+) data type to store kv cache")
_SGLANG_ALLOC = re.compile(r"KV Cache is allocated\. dtype: torch\.(\w+)")

# (marker, kind): the lines quantrack reads, in the order they decide
MARKERS: tuple[tuple[str, str], ...] = (
    ("fp8_e5m2 kv-cache is not supported with fp8 checkpoints", "refused"),
    ("does not support loading scaling factors", "refused"),
    ('assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}', "refused"),
    ("Dynamic per-token-head scales will be computed at runtime", "dynamic"),
    ("`--calculate-kv-scales` option is deprecated", "computed"),
    ("Loaded KV cache scaling factors from", "loaded"),
    ("Using KV cache scaling factor 1.0", "unscaled"),
    ("no scaling factors provided. Defaulting to scaling factors of 1.0", "unscaled"),
    ("Using uncalibrated q_scale", "q_uncalibrated"),
    ("does not provide a q scaling factor", "q_missing"),
    ("DEPRECATED. Found kv_scale in the checkpoint", "checkpoint_kv_scale"),
)
_DROPPED = re.compile(r"(?:Found [kvq]_scale in the checkpoint .*is not loaded|Parameter \S*[kv]_scale not found in "
                      r"params_dict)")


@dataclass
class KVScaleObservation:
    """What the log says about KV scales: a source (or unknown), why, and the lines."""

    source: ScaleSource
    reason: str
    kv_dtype: str | None = None  # the quantized KV dtype the log shows, if any
    evidence: list[dict[str, Any]] = field(default_factory=list)  # {line_no, kind, line}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["source"] = self.source.value
        return d

    def evidence_text(self, source_name: str = "log") -> str | None:
        if not self.evidence:
            return None
        e = self.evidence[0]
        return f"{source_name}:{e['line_no']}: {e['line'].strip()[:300]}"


def _ev(kind: str, at: tuple[int, str]) -> dict[str, Any]:
    return {"line_no": at[0], "kind": kind, "line": at[1].strip()[:500]}


# what an engine's silence means for a quantized (non-e5m2) KV cache with no KV-scale line: (quantization method or
# None, whether the log reaches past the weight loading) -> (source, why); None: the silence says nothing
Silence = Callable[[str | None, bool], tuple[ScaleSource, str] | None]


def decide(found: dict[str, tuple[int, str]], dropped: tuple[int, str] | None, kv_dtype: str | None,
           quantization: str | None, *, covers_load: bool = True, unscaled_note: str = "",
           silence: Silence | None = None) -> KVScaleObservation:
    """The verdict from the lines found (pure; an adapter's ``observe_kv_scales`` feeds it what the parser's pass
    collected, through ``observe_lines``). ``covers_load``: the log reaches past the weight loading, where the scale
    warnings are printed (an absence of a line is evidence only then). The engine's own part: ``unscaled_note``, what
    its 'scales 1.0' line does not say, and ``silence``, what no line at all means."""
    evidence = [_ev(k, v) for k, v in sorted(found.items(), key=lambda kv: kv[1][0])]
    if dropped:
        evidence.append(_ev("checkpoint_scale_not_loaded", dropped))
    kvq = (kv_dtype or "").lower()
    quantized_kv = bool(kvq) and kvq not in ("auto", "bfloat16", "bf16", "float16", "fp16", "half")
    q = None if quantization in (None, "None", "none") else quantization

    decisive = {ScaleSource.REFUSED: "refused", ScaleSource.DYNAMIC_PER_TOKEN_HEAD: "dynamic",
                ScaleSource.COMPUTED: "computed", ScaleSource.CHECKPOINT: "loaded", ScaleSource.UNSCALED: "unscaled"}

    def obs(src: ScaleSource, reason: str) -> KVScaleObservation:
        first = decisive.get(src)  # the line that decided goes first (the run tag quotes it)
        ordered = sorted(evidence, key=lambda e: (e["kind"] != first, e["line_no"]))
        return KVScaleObservation(src, reason, kv_dtype, ordered)

    if "refused" in found:
        return obs(ScaleSource.REFUSED, "the engine refused this KV dtype / scale combination at start")
    if "dynamic" in found:
        return obs(ScaleSource.DYNAMIC_PER_TOKEN_HEAD, "per-token-head KV: scales computed per (token, head) at "
                                                       "cache write")
    if "computed" in found:
        return obs(ScaleSource.COMPUTED, "--calculate-kv-scales: scales computed once from the first forward pass "
                                         "(the engine's deprecation line)")
    if "loaded" in found:
        return obs(ScaleSource.CHECKPOINT, "the engine loaded the KV scales from the file it names")
    if "unscaled" in found:
        why = "the engine's own line: k/v scales 1.0"
        if dropped:
            why += "; checkpoint scale tensors were present but not loaded"
        return obs(ScaleSource.UNSCALED, why + unscaled_note)
    if not quantized_kv:
        if kv_dtype is None:
            return obs(ScaleSource.UNKNOWN, "the log shows no KV dtype and no KV-scale line")
        return obs(ScaleSource.NOT_QUANTIZED, f"KV cache {kv_dtype}: not quantized")
    if "e5m2" in kvq:
        return obs(ScaleSource.UNSCALED, "fp8_e5m2 KV: the engines load no scales for e5m2 and print no line for it")
    said = silence(q, covers_load) if silence is not None else None
    if said is not None:
        return obs(*said)
    return obs(ScaleSource.UNKNOWN, f"quantized KV ({kv_dtype}) but no KV-scale line in the log")


# ---- in the engines' own single pass (quantrack.engines.logparse): the rules, and the verdict at finish()

_DROP_MARKERS = ("is not loaded", "not found in params_dict")


def _collect(kind: str):  # type: ignore[no-untyped-def]
    def handler(b: Any, ln: Any) -> None:
        seen = b.report.extra.setdefault(_KV_LINES, {})
        seen.setdefault(kind, (ln.no, ln.text))
    return handler


def _dropped(b: Any, ln: Any) -> None:
    if _DROPPED.search(ln.text):
        b.report.extra.setdefault(_KV_LINES, {}).setdefault("_dropped", (ln.no, ln.text))


_KV_LINES = "_kv_scale_lines"  # scratch space in LogReport.extra while scanning; removed by take_lines
# the KV dtype as the engine states it: vLLM's cache-config line, SGLang's allocation line
_DTYPE_MARKERS = (("data type to store kv cache", "_dtype_line"), ("KV Cache is allocated. dtype:", "_dtype_line"))
RULES: list[Any] = [*((marker, _collect(kind)) for marker, kind in (*MARKERS, *_DTYPE_MARKERS)),
                    *((m, _dropped) for m in _DROP_MARKERS)]


def observe_lines(report: Any, seen: dict[str, tuple[int, str]], *, unscaled_note: str = "",
                  silence: Silence | None = None) -> KVScaleObservation:
    """The verdict of an engine that prints KV-scale lines (vLLM, SGLang: ``MARKERS``), from the lines the pass
    collected and the report's own fields; ``unscaled_note`` and ``silence`` as for ``decide``."""
    dropped = seen.pop("_dropped", None)
    stated = seen.pop("_dtype_line", None)
    m = (_KV_DTYPE_LINE.search(stated[1]) or _SGLANG_ALLOC.search(stated[1])) if stated else None
    kv = m.group(1) if m else report.kv_cache_dtype
    covers = report.weights_gib is not None or report.available_kv_gib is not None or \
        report.kv_cache_tokens is not None or report.extra.get("num_gpu_blocks") is not None
    return decide(seen, dropped, kv, report.quantization, covers_load=covers, unscaled_note=unscaled_note,
                  silence=silence)


def take_lines(report: Any) -> dict[str, tuple[int, str]]:
    """The KV-scale lines the pass collected (kind -> (line number, line)), removed from ``report.extra``."""
    seen: dict[str, tuple[int, str]] = report.extra.pop(_KV_LINES, None) or {}
    return seen
