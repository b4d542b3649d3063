"""SGLang adapter: ``python -m sglang.launch_server`` argv, startup-log parser and live queries
(``/get_server_info``, newer ``/server_info``).

Patterns cite the f-strings in engine-facts.md §1.3/§2 (sglang@v0.5.23) and were checked against
the real 0.5.16 logs in reference data: sglang-h200. SGLang's "GB" is GiB (engine-facts §1.3).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from quantrack.arms import Arm
from quantrack.engines.base import (
    EngineAdapter,
    Install,
    LaunchSpec,
    LinePrefix,
    LiveFacts,
    LogReport,
    Marker,
    MemoryModel,
    Serving,
)
from quantrack.engines.kvplan import UNQUANTIZED_KV, KVScaleRequest, ScalePlan, rule
from quantrack.engines.kvscale import RULES as KV_SCALE_RULES
from quantrack.engines.kvscale import KVScaleObservation, observe_lines
from quantrack.engines.logparse import (
    FileSource,
    Line,
    ReportBuilder,
    RuleSpec,
    done_when,
    none_word,
    parse_float,
    parse_int,
    scan,
    startup_only,
    torch_dtype_short,
)
from quantrack.engines.runcheck import StartLine, run_rules, settle
from quantrack.engines.scoring import TopK, truncate_topk
from quantrack.engines.vllm import GGUF_TYPES, hf_arm, rulebook_flags
from quantrack.errors import BadInput

if TYPE_CHECKING:
    from quantrack.hardware.capacity import CapacitySettings, EnginePrediction
    from quantrack.hardware.catalog import ModelShape


# --- arm -> flags (spellings from the rulebook: rules/methods.toml; see vllm.py) -----------------------------------
def sglang_flags(arm: Arm) -> list[str]:
    if arm.weights in GGUF_TYPES:
        raise BadInput(f"arm {arm.name!r}: weights {arm.weights} is a GGUF type; serve it with --engine llamacpp")
    return rulebook_flags("sglang", arm)


# --- log patterns -------------------------------------------------------------------------------
# "Load weight end. elapsed=%.2f s, type=%s, [quant=..., ]avail mem=%.2f GB, mem usage=%.2f GB."
#   sglang@v0.5.23:python/sglang/srt/model_executor/model_runner.py:L1373-L1378
# older builds print the activation dtype there instead of quant=: "Load weight end. type=Gemma3ForConditionalGeneration,
# dtype=torch.bfloat16, avail mem=3.64 GB, mem usage=18.82 GB." (github.com/sgl-project/sglang/issues/4895)
# SGLang <= 0.2 printed no mem usage: f"Load weight end. type={...}, dtype={self.dtype}, avail mem={...:.2f} GB"
# (sglang@v0.2.14:python/sglang/srt/model_executor/model_runner.py:L210-L215): the weights are then derived from the
# rank's "Load weight begin. avail mem=%.2f GB" (L157) minus its avail mem after loading, and labelled so
_LOAD_END = re.compile(r"Load weight end\. (?:elapsed=[\d.]+ s, )?type=(\w+), (?:dtype=([\w.]+), )?(?:(quant=.*?), )?"
                       r"avail mem=([\d.]+) GB(?:, mem usage=(-?[\d.]+) GB)?")
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([\d.]+) GB")
# "Using KV cache dtype: torch.bfloat16" (github.com/kvcache-ai/ktransformers/issues/1870, SGLang 0.5.x)
_KV_DTYPE = re.compile(r"Using KV cache dtype: ([\w.]+)")
# "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens)." (github.com/sgl-project/sglang/issues/4048)
_TOO_LONG = re.compile(r"Input length \((\d+) tokens\) exceeds the maximum allowed length \((\d+) tokens\)")
# "KV Cache is allocated. dtype: %s, #tokens: %d, K size: %.2f GB, V size: %.2f GB" (or "KV size:")
#   .../mem_cache/memory_pool.py:L2088-L2097; older builds omit "dtype:" (issue vllm-project/vllm#21348)
_KV_ALLOC = re.compile(r"KV Cache is allocated\.(?: dtype: ([\w.]+),)? #tokens: (\d+), "
                       r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")
# "max_total_num_tokens=%d, chunked_prefill_size=..., max_running_requests=%d, context_len=%d, available_gpu_mem=%.2f GB"
#   .../managers/scheduler.py:L1269-L1275
_MAX_TOTAL = re.compile(r"max_total_num_tokens=(\d+)")
# a hybrid (sliding-window + full attention) model: two pools, "Use sliding window memory pool. full_layer_tokens=%d,
# swa_layer_tokens=%d" (tests/data/wild3/sglang-18039-...): the capacity is the full pool's, not the window's
_SWA_POOL = re.compile(r"Use sliding window memory pool\. full_layer_tokens=(\d+), swa_layer_tokens=(\d+)")
# a draft model's load line names its class: "...ForCausalLMNextN" (DeepSeek MTP), "...Eagle"/"...Eagle3", "...MTP"
_DRAFT_CLASS = re.compile(r"(?:NextN|Eagle3?|MTP)$")
_KV_FIELDS = {k: re.compile(rf"\b{k}=([\w.]+)") for k in
              ("max_running_requests", "context_len", "chunked_prefill_size", "max_prefill_tokens",
               "available_gpu_mem")}
# "Online %s quantization: quantized %d layers of types: %s"  .../load_model_utils.py:L172
_ONLINE = re.compile(r"Online (\S+) quantization: quantized (\d+) layers")
# "Capture {name} CUDA graph end. ... mem usage=%.2f GB" (cuda_graph_setup.py:L696, L788);
# older builds: "Capture cuda graph end. Time elapsed: 5.02 s. mem usage=0.24 GB."
_GRAPH_END = re.compile(r"Capture (?:([\w ]+?) )?(?:cuda|CUDA) graph end\..*?mem usage=(-?[\d.]+) GB")
_SERVER_ARGS = {k: re.compile(rf"\b{k}=('[^']*'|None|[\w.]+)") for k in
                ("quantization", "kv_cache_dtype", "dtype", "attention_backend", "tp_size", "mem_fraction_static",
                 "context_length", "model_path", "dp_size", "pp_size", "enable_dp_attention")}
_ATTN_DEFAULT = re.compile(r"Attention backend not specified\. Use (\S+) backend by default")
_ATTN_MODEL = re.compile(r"Using (\S+) as attention backend")
_MIN_CAP = re.compile(r"is not supported for the current GPU\. Minimum capability: (\d+)\. Current capability: (\d+)")
_VERSION = re.compile(r"sglang(?: version|==| v)\s*(\d+\.\d+\.\d+\S*)", re.IGNORECASE)


# SGLang's line prefix: ``[2026-02-27 17:10:27 TP0] text`` / ``[2026-11-29 11:08:09] text`` / 0.3's ``[16:43:29 TP0] text``
LINE_PREFIXES = (
    LinePrefix("[", re.compile(
        r"^\[(?P<ts>(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d)"
        r"(?:\s+(?P<rank>(?:DP\d+\s*)?(?:PP\d+\s*)?(?:TP\d+)?(?:\s*EP\d+)?))?\]\s?")),
)

# --- detection (quantrack.engines.detect): lines that say SGLang wrote a log
# Each marker names where it was seen: a format string (repo@sha:path:Lnn, engine-facts.md) or a public log kept
# verbatim in tests/data/public-logs/ (named by its file there); anchors: literals every match contains.
# fmt: off
MARKERS: tuple[Marker, ...] = (
    Marker("sglang", "SGLang log prefix", r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]", 2, "sglang-29575-max-total-tokens.log",
           ("[1", "[2")),
    Marker("sglang", "SGLang rank prefix", r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d (?:DP\d+ ?)?(?:PP\d+ ?)?(?:TP\d+)(?: ?EP\d+)?\]", 5,
           "sglang-11716-tp8-init.log; 0.3 printed the time only: sglang-1612-v03-runtime-time-prefix.log",
           (" TP",)),
    Marker("sglang", "SGLang batch lines", r"(?:Prefill|Decode) batch\. #(?:new-seq|running-req): \d+", 5,
           "sglang-1612-v03-runtime-time-prefix.log",
           (" batch. #",)),
    Marker("sglang", "SGLang server args", r"server_args=ServerArgs\(", 8, "sglang@v0.5.23:python/sglang/srt/server_args.py",
           ("server_args=ServerArgs(",)),
    Marker("sglang", "SGLang scheduler summary", r"max_total_num_tokens=\d+", 6, "sglang@v0.5.23:python/sglang/srt/managers/scheduler.py:L1269",
           ("max_total_num_tokens=",)),
    Marker("sglang", "SGLang KV pool", r"KV Cache is allocated\.|Memory pool end\.|Mamba Cache is allocated\.", 6,
           "sglang@v0.5.23:python/sglang/srt/mem_cache/memory_pool.py:L2088",
           ("KV Cache is allocated", "Memory pool end", "Mamba Cache is allocated")),
    Marker("sglang", "SGLang weight load", r"Load weight (?:begin|end)\.", 6, "sglang@v0.5.23:python/sglang/srt/model_executor/model_runner.py:L1373",
           ("Load weight ",)),
    Marker("sglang", "SGLang init lines", r"Init torch distributed (?:begin|ends)|Capture (?:[\w ]+ )?(?:cuda|CUDA) graph (?:begin|end)|"
           r"Using KV cache dtype: |Scheduler hit an exception", 4, "sglang-11716-..., sglang-ktransformers1870-...",
           ("Init torch distributed", " graph begin", " graph end", "Using KV cache dtype", "Scheduler hit an exception")),
    Marker("sglang", "SGLang name", r"\bsglang\b|\bSGLang\b|--mem-fraction-static|\bmem_fraction_static\b|--allow-auto-truncate", 4,
           "sglang-4048-tp8-input-too-long.log ('--allow-auto-truncate')",
           ("sglang", "SGLang", "mem-fraction-static", "mem_fraction_static", "allow-auto-truncate")),
    Marker("sglang", "SGLang CUDA-graph progress bar", r"Capturing (?:num tokens \(num_tokens=\d+ |batches \((?:bs=\d+ )?)avail_mem=", 3,
           "tests/data/logs/h200-util045/sglang-0.5.16-bf16.log (SGLang 0.5.16 tqdm bar)",
           ("Capturing num tokens (", "Capturing batches (")),
    Marker("sglang", "Marlin FP8 fallback text", r"does not have native support for FP8 computation", 1, "engine-facts §2.1",
           ("native support for FP8",)),
)
# fmt: on

EXPECTED = (
    "engine_version", "gpu", "weights_gib", "available_kv_gib", "kv_cache_tokens", "max_concurrency",
    "max_concurrency_context", "cuda_graph_gib", "quantization", "attention_backend", "kv_cache_dtype", "dtype",
)


def _server_args(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    if "server_args=ServerArgs(" not in t:
        return
    vals: dict[str, str] = {}
    for key, rx in _SERVER_ARGS.items():
        m = rx.search(t)
        if m:
            vals[key] = m.group(1).strip("'")
    if "quantization" in vals:
        b.set("quantization", none_word(vals["quantization"]))
    if "kv_cache_dtype" in vals:
        b.extra("kv_cache_dtype_arg", vals["kv_cache_dtype"])
    if "dtype" in vals:
        b.extra("dtype_arg", vals["dtype"])
    if vals.get("attention_backend") not in (None, "None"):
        b.set("attention_backend", vals["attention_backend"])
    for key in ("tp_size", "dp_size", "pp_size"):
        if key in vals:
            b.extra(key, parse_int(vals[key]))
    if vals.get("enable_dp_attention") == "True":
        b.extra("enable_dp_attention", True)
    if "mem_fraction_static" in vals:
        b.extra("mem_fraction_static", parse_float(vals["mem_fraction_static"]))
    if vals.get("context_length") not in (None, "None"):
        b.extra("context_length_arg", parse_int(vals["context_length"]))


def _load_end(b: ReportBuilder, ln: Line) -> None:
    m = _LOAD_END.search(ln.text)
    if m and _DRAFT_CLASS.search(m.group(1)):
        # the speculative draft (NextN/MTP or EAGLE) loads after the target: its weights are not the model's
        b.extra("draft_model", True)
        b.extra("draft_model_class", m.group(1))
        if m.group(5) and not m.group(5).startswith("-"):
            b.extra("draft_weights_gib", parse_float(m.group(5)))
        return
    if m:
        b.extra("model_class", m.group(1))
        if m.group(2):
            # the activation dtype, not the weights' format: an FP8 checkpoint prints torch.bfloat16 here too
            b.extra("activation_dtype", torch_dtype_short(m.group(2)))
            b.set("dtype", torch_dtype_short(m.group(2)))
        if m.group(3):
            b.extra("quant_str", m.group(3))
            b.extra("quant_from_load_line", m.group(3).split(",")[0].removeprefix("quant="))
            b.set("quantization", m.group(3).split(",")[0].removeprefix("quant="))
        b.extra("avail_mem_after_load_gib", parse_float(m.group(4)))
        if m.group(5) and m.group(5).startswith("-"):
            # SGLang's "mem usage" is free memory before minus after: another process on the GPU released memory
            # while this one loaded (measured: -20.23 GB beside three other servers). Not the weights' size.
            b.extra("weights_gib_unknown", f"SGLang printed mem usage={m.group(5)} GB at 'Load weight end': free GPU "
                                           "memory rose while it loaded (another process released memory), so the "
                                           "weights' size cannot be read from this log", overwrite=True)
        elif m.group(5):
            b.set("weights_gib", parse_float(m.group(5)))
        else:
            ends = b.report.extra.setdefault("_avail_end", {})
            ends.setdefault(ln.rank or "", parse_float(m.group(4)))


def _load_begin(b: ReportBuilder, ln: Line) -> None:
    m = _LOAD_BEGIN.search(ln.text)
    if m:
        begins = b.report.extra.setdefault("_avail_begin", {})
        begins.setdefault(ln.rank or "", parse_float(m.group(1)))


def _swa_pool(b: ReportBuilder, ln: Line) -> None:
    m = _SWA_POOL.search(ln.text)
    if m and "_swa_pool" not in b.report.extra:
        b.extra("_swa_pool", (int(m.group(1)), int(m.group(2)), ln.no))


def _kv_alloc(b: ReportBuilder, ln: Line) -> None:
    m = _KV_ALLOC.search(ln.text)
    if not m:
        return
    gib = round(float(m.group(3)) + float(m.group(4)), 2) if m.group(3) else (float(m.group(5)) if m.group(5) else None)
    allocs = b.report.extra.setdefault("_kv_allocs", {})
    allocs.setdefault(int(m.group(2)), gib)  # one line per pool (ranks repeat them)
    if m.group(1):
        b.set("kv_cache_dtype", torch_dtype_short(m.group(1)))
    b.set("kv_cache_tokens", int(m.group(2)))
    if m.group(3):
        k, v = float(m.group(3)), float(m.group(4))
        b.extra("k_size_gib", k)
        b.extra("v_size_gib", v)
        b.set("available_kv_gib", round(k + v, 2))
    elif m.group(5):
        b.set("available_kv_gib", float(m.group(5)))


def _max_total(b: ReportBuilder, ln: Line) -> None:
    m = _MAX_TOTAL.search(ln.text)
    if not m:
        return
    # the scheduler's figure is the final capacity (after any --max-total-tokens cap)
    b.set("kv_cache_tokens", int(m.group(1)), overwrite=not b.report.extra.get("_max_total_seen"))
    b.extra("_max_total_seen", True)
    for key, rx in _KV_FIELDS.items():
        mm = rx.search(ln.text)
        if mm:
            b.extra(key, parse_float(mm.group(1)) if key == "available_gpu_mem" else parse_int(mm.group(1)))


def _online(b: ReportBuilder, ln: Line) -> None:
    m = _ONLINE.search(ln.text)
    if m:
        b.set("quantization", m.group(1), overwrite=b.report.quantization == "none")
        b.extra("online_quantized_layers", int(m.group(2)))


def _graph_end(b: ReportBuilder, ln: Line) -> None:
    m = _GRAPH_END.search(ln.text)
    if not m:
        return
    name = (m.group(1) or "decode").strip()
    if m.group(2).startswith("-"):  # free memory rose during capture (another process): not this graph's size
        b.extra("cuda_graph_gib_unknown", f"SGLang printed mem usage={m.group(2)} GB at the end of {name} graph "
                                          "capture: free GPU memory rose meanwhile (another process)", overwrite=True)
        return
    graphs = b.report.extra.setdefault("cuda_graph_mem_gib", {})
    if name not in graphs:  # TP ranks repeat the line: count once
        graphs[name] = float(m.group(2))
        b.report.cuda_graph_gib = round(sum(graphs.values()), 2)


def _attention(b: ReportBuilder, ln: Line) -> None:
    m = _ATTN_DEFAULT.search(ln.text) or _ATTN_MODEL.search(ln.text)
    if m:
        b.set("attention_backend", m.group(1).strip("."))


def _version(b: ReportBuilder, ln: Line) -> None:
    m = _VERSION.search(ln.text)
    if m:
        b.set("engine_version", m.group(1))


def _kv_dtype(b: ReportBuilder, ln: Line) -> None:
    m = _KV_DTYPE.search(ln.text)
    if m:
        b.set("kv_cache_dtype", torch_dtype_short(m.group(1)))


def _too_long(b: ReportBuilder, ln: Line) -> None:
    m = _TOO_LONG.search(ln.text)
    if m:
        b.extra("max_req_input_len", int(m.group(2)))
        b.error("input_too_long", ln)


def _mamba(b: ReportBuilder, ln: Line) -> None:
    b.extra("mamba_cache", True)


# a launch command pasted into the log: "python -m sglang.launch_server ... --tp 4" (server_args.py flag names)
_CMD_SIZES = {"tp_size": re.compile(r"--(?:tp|tp-size|tensor-parallel-size)[ =](\d+)"),
              "dp_size": re.compile(r"--(?:dp|dp-size|data-parallel-size)[ =](\d+)"),
              "pp_size": re.compile(r"--(?:pp|pp-size|pipeline-parallel-size)[ =](\d+)")}


def _command_line(b: ReportBuilder, ln: Line) -> None:
    for key, rx in _CMD_SIZES.items():
        m = rx.search(ln.text)
        if m:
            b.extra(key, int(m.group(1)))
    if re.search(r"--enable-dp-attention\b", ln.text):
        b.extra("enable_dp_attention", True)


# The parallel layout per SGLang's own rules (sglang@v0.5.23, paths under python/sglang/srt/):
# - plain data parallelism launches one TP group per DP rank, each on its own GPUs: the next group's base GPU id
#   advances by tp_size x pp_size (managers/data_parallel_controller.py:L420-L449, launch_dp_schedulers), so
#   dp x tp x pp GPUs;
# - with --enable-dp-attention the DP ranks live inside the one TP group: it launches tp_size ranks in total
#   (launch_dp_attention_schedulers, L715: "for tp_rank in tp_rank_range", GPU id from tp_rank at L747-L752), each
#   rank's attention DP rank is tp_rank // attn_tp_size (L720-L725 -> layers/dp_attention.py:L445-L460), and the
#   attention TP width is tp_size // dp_size (runtime_context.py:L73-L76): tp x pp GPUs, dp groups of tp / dp GPUs,
#   each group with its own KV cache;
# - the log prefix is " DP{dp_rank}" + " TP{tp_rank}" (managers/scheduler.py:L6280-L6289) in both layouts, so
#   prefixes alone do not say which one ran.
LAYOUT_SOURCE = ("sglang@v0.5.23:python/sglang/srt/managers/data_parallel_controller.py:L420-L449 (DP replicas), "
                 "L715-L752 (DP attention); layers/dp_attention.py:L445-L460; runtime_context.py:L73-L76")


def parallel_layout(extra: dict[str, Any]) -> dict[str, Any] | None:
    """GPUs, DP groups and the attention-TP width a log's stated sizes imply, or None when the log states no DP
    size (prefixes alone cannot tell DP attention from DP replicas)."""
    tp = extra.get("tp_size") or 1
    pp = extra.get("pp_size") or 1
    dp = extra.get("dp_size")
    if not isinstance(dp, int):
        return None
    if extra.get("enable_dp_attention"):
        return {"layout": "dp_attention", "gpus": tp * pp, "dp_groups": dp, "attn_tp_size": max(tp // dp, 1),
                "kv_caches": dp, "source": LAYOUT_SOURCE}
    return {"layout": "dp_replicas" if dp > 1 else "single", "gpus": dp * tp * pp, "dp_groups": dp,
            "attn_tp_size": tp, "kv_caches": dp, "source": LAYOUT_SOURCE}


def _rank(b: ReportBuilder, ln: Line) -> None:
    b.note_rank(ln)


def _min_cap(b: ReportBuilder, ln: Line) -> None:
    m = _MIN_CAP.search(ln.text)
    if m:
        b.extra("min_capability", int(m.group(1)))
        b.extra("current_capability", int(m.group(2)))
        b.error("min_capability_error", ln)


def _untuned_config(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    if "Using default W8A8 Block FP8 kernel config" in t:
        b.warning("w8a8_block_fp8_default_config", ln)
    elif "Using default MoE config. Performance might be sub-optimal" in t or "Using default MoE kernel config" in t:
        b.warning("moe_default_config", ln)  # "MoE kernel config": SGLang of 2025-12 (wild3/sglang-15464-...)
    elif "down_moe=False. Performance might be sub-optimal" in t:
        # no tuned config for the down projection: it runs the untuned one (wild3/sglang-19003-..., -15464-...)
        b.warning("moe_down_config_missing", ln)
    elif "Fallback to triton version" in t and "Performance might be sub-optimal" in t:
        # a config tuned under another Triton version is used (wild3/sglang-19003-...)
        b.warning("moe_config_other_triton_version", ln)


def _bf16_fp16(b: ReportBuilder, ln: Line) -> None:
    b.fallback("bf16_to_fp16", ln)
    b.set("dtype", "fp16")


def _simple(kind: str, bucket: str):  # type: ignore[no-untyped-def]
    def handler(b: ReportBuilder, ln: Line) -> None:
        b.event(bucket, kind, ln)
    return handler


def _generic_error(b: ReportBuilder, ln: Line) -> None:
    t = ln.text.lstrip()
    if (t.startswith(("ERROR", "RuntimeError:", "ValueError:", "torch.OutOfMemoryError", "Traceback"))
            and len(b.report.errors) < 50):
        b.error("error", ln)


# Fallback and degraded-mode lines (engine-facts §2.1-§2.5): looked for in every log, whatever engine was detected.
FALLBACK_RULES: list[RuleSpec] = [
    ("does not have native support for FP8 computation", _simple("fp8_marlin", "fallbacks")),
    ("does not have native support for FP4 computation", _simple("fp4_marlin", "fallbacks")),
    ("explicitly, so forcing", _simple("awq_gptq_forced", "fallbacks")),
    ("Falling back to unoptimized", _simple("layer_unoptimized_fallback", "fallbacks")),
    ("Use float16 due to lack of bfloat16 support", _bf16_fp16),
    ("Using FP8 KV cache but no scaling factors provided", _simple("kv_scale_uncalibrated", "warnings"), startup_only()),
    # untuned Triton configs (degraded, the same text as vLLM's: tests/data/public-logs/sglang-5675-...)
    ("Performance might be sub-optimal", _untuned_config, startup_only(1)),
]

RULES: list[RuleSpec] = [
    ("server_args=ServerArgs(", _server_args, done_when("mem_fraction_static")),
    ("Using KV cache dtype:", _kv_dtype, done_when("kv_cache_dtype")),
    ("exceeds the maximum allowed length", _too_long, done_when("max_req_input_len")),
    ("Mamba Cache is allocated", _mamba, startup_only(2, "mamba_cache")),
    (" TP", _rank, lambda b: b.ranks_done()),
    ("sglang.launch_server", _command_line, startup_only()),
    ("Scheduler hit an exception", _simple("error", "errors")),
    ("Load weight end.", _load_end, done_when("weights_gib")),
    ("Load weight begin.", _load_begin, done_when("weights_gib")),
    ("KV Cache is allocated", _kv_alloc, startup_only(2)),
    ("Use sliding window memory pool", _swa_pool, startup_only(2)),
    ("self.draft_worker = ", lambda b, ln: b.extra("draft_model", True), startup_only()),
    # a traceback through Scheduler.__init__: the scheduler was never built, the start failed
    ("scheduler = Scheduler(", _simple("scheduler_init_failed", "errors"), startup_only()),
    ("max_total_num_tokens=", _max_total, done_when("context_len")),
    ("quantization: quantized", _online, startup_only(2, "online_quantized_layers")),
    ("graph end.", _graph_end, done_when("context_len")),  # graphs are captured before the summary line
    ("Attention backend not specified", _attention, done_when("attention_backend")),
    ("as attention backend", _attention, done_when("attention_backend")),
    ("sglang", _version, startup_only(2, "engine_version")),
    ("SGLang", _version, startup_only(2, "engine_version")),
    ("not supported for the current GPU", _min_cap, startup_only()),
    # fallbacks / warnings / errors (engine-facts §2.1-§2.5)
    *FALLBACK_RULES,
    ("is larger than the profiled value", _simple("max_total_tokens_capped", "warnings"), startup_only()),
    ("SGLang only supports sm75 and above", _simple("min_capability_error", "errors"), startup_only()),
    ("leave no GPU memory for the KV cache", _simple("no_kv_memory", "errors"), startup_only()),
    ("does not support loading scaling factors", _simple("kv_scale_load_error", "errors"), startup_only()),
    ("Error", _generic_error),
    ("ERROR", _generic_error),
    ("Traceback", _generic_error),
]


# lines an SGLang launch prints once (quantrack.engines.runcheck: one log, one run)
START_LINES: tuple[StartLine, ...] = (("server_args=ServerArgs(", "server_args=ServerArgs(", "SGLang server_args line"),)


def parse_sglang_log(lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource, source: str | None = None,
                     extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
    b = ReportBuilder("sglang", source, EXPECTED)
    scan(lines, b, [*RULES, *run_rules(START_LINES), *KV_SCALE_RULES, *extra_rules])
    r = b.report
    r.extra.pop("_max_total_seen", None)
    # dtype: the activation dtype is not printed; with --dtype auto and an 'auto' KV cache the pool
    # dtype is the activation dtype, so report it then (labelled), otherwise the --dtype argument.
    if r.dtype is None:
        if r.extra.get("kv_cache_dtype_arg") == "auto" and r.kv_cache_dtype:
            r.dtype = r.kv_cache_dtype
            r.extra.setdefault("derived", {})["dtype"] = "KV pool dtype with --kv-cache-dtype auto"
        elif r.extra.get("dtype_arg") not in (None, "auto"):
            r.dtype = r.extra["dtype_arg"]
    begins, ends = r.extra.pop("_avail_begin", {}), r.extra.pop("_avail_end", {})
    if r.weights_gib is None and "weights_gib_unknown" not in r.extra:
        rank = next((k for k in ends if k in begins and begins[k] is not None and ends[k] is not None), None)
        if rank is not None and begins[rank] < ends[rank]:  # free memory rose: another process, not the weights
            r.extra["weights_gib_unknown"] = (f"free GPU memory rose while loading ({begins[rank]} -> {ends[rank]} GB"
                                              "): another process released memory, so the weights' size cannot be "
                                              "derived from this log")
        elif rank is not None:  # no "mem usage=" (SGLang <= 0.2): the rank's free memory before minus after loading
            r.weights_gib = round(begins[rank] - ends[rank], 2)
            r.extra.setdefault("derived", {})["weights_gib"] = (f"avail mem at 'Load weight begin' minus at 'Load "
                                                               f"weight end'{f' ({rank})' if rank else ''}")
    _resolve_pools(r)
    layout = parallel_layout(r.extra)
    r.extra["parallel_layout"] = layout["layout"] if layout else None
    if layout:
        r.extra["gpus"] = layout["gpus"]
        r.extra["attn_tp_size"] = layout["attn_tp_size"]
        r.extra["layout_source"] = layout["source"]
    ctx = r.extra.get("context_len")
    if r.kv_cache_tokens and ctx:
        r.max_concurrency_context = int(ctx)
        r.max_concurrency = round(r.kv_cache_tokens / int(ctx), 2)
        r.extra.setdefault("derived", {})["max_concurrency"] = "max_total_num_tokens / context_len"
    report = b.finish()
    settle(report)
    return report


def _resolve_pools(r: LogReport) -> None:
    """The KV pools: one "KV Cache is allocated" line per pool. A hybrid model's sliding-window and full-attention
    pools are reported as ``kv_pools`` (kind, tokens, GiB); the capacity is the full pool's tokens (the window pool
    holds only the last window of each request); the pools' GiB are summed only when every pool's line is in the log."""
    allocs: dict[int, float | None] = r.extra.pop("_kv_allocs", {})
    swa = r.extra.pop("_swa_pool", None)
    if swa is None:
        return
    full, window, _ = swa
    for key in ("k_size_gib", "v_size_gib"):  # the first pool line's K/V sizes are one pool's, not the cache's
        r.extra.pop(key, None)
    pools = [{"kind": "full", "tokens": full, "gib": allocs.get(full)},
             {"kind": "swa", "tokens": window, "gib": allocs.get(window)}]
    r.extra["kv_pools"] = pools
    r.kv_cache_tokens = full
    r.extra.setdefault("derived", {})["kv_cache_tokens"] = "the full-attention pool's tokens (full_layer_tokens)"
    if all(p["gib"] is not None for p in pools):
        r.available_kv_gib = round(sum(float(p["gib"]) for p in pools), 2)  # type: ignore[arg-type]
    else:
        r.available_kv_gib = None
        missing = ", ".join(p["kind"] for p in pools if p["gib"] is None)
        r.extra["available_kv_gib_unknown"] = (f"hybrid KV pools: the 'KV Cache is allocated' line of the {missing} "
                                               "pool is not in the log, so the KV memory of all pools is unknown")


# --- live queries -------------------------------------------------------------------------------
def parse_server_info(obj: Any) -> dict[str, Any]:
    """Pure: ``/get_server_info`` (or ``/server_info``) JSON -> the capacity facts.

    Real examples: reference data: sglang-h200/server-info-*.json (SGLang 0.5.16).
    """
    if not isinstance(obj, dict):
        return {}
    keys = ("version", "max_total_num_tokens", "kv_cache_dtype", "quantization", "model_path", "dtype",
            "context_length", "mem_fraction_static", "tp_size", "attention_backend", "max_running_requests",
            "page_size", "max_req_input_len")
    out = {k: obj.get(k) for k in keys if k in obj}
    states = obj.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        for k in ("max_total_num_tokens", "last_gen_throughput", "memory_usage"):
            if k in states[0] and k not in out:
                out[k] = states[0][k]
    if "version" in out:
        out["engine_version"] = out.pop("version")
    return out

# --- prompt-logprob scoring: the wire format (pure; checked against the engine source or a real response) ------
def sglang_request(ids: Sequence[int], start: int, k: int) -> tuple[str, dict[str, Any]]:
    """POST /generate with ``input_ids`` scoring positions ``start..``.

    ``GenerateReqInput`` fields input_ids, return_logprob, logprob_start_len, top_logprobs_num,
    sampling_params (sgl-project/sglang, python/sglang/srt/managers/io_struct.py). The scheduler pads the first
    returned entry with None ("Always pad the first one with None") and returns one entry per token of
    ``origin_input_ids[logprob_start_len:]`` (python/sglang/srt/managers/scheduler_output_processor_mixin.py,
    ``add_input_logprob_return_values``), so ``logprob_start_len = start - 1`` makes entries 1.. score
    ``ids[start:]``.
    """
    if start < 1:
        raise ValueError("the first token has no context to be scored from")
    return "/generate", {"input_ids": list(ids), "return_logprob": True, "logprob_start_len": start - 1,
                         "top_logprobs_num": k, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def parse_sglang(resp: Any, ids: Sequence[int], start: int, k: int) -> list[TopK]:
    """Top-k per position for ``ids[start:]`` from ``meta_info.input_top_logprobs``.

    Each entry is a list of ``[logprob, token_id, text-or-null]`` triples, or null for the padded first entry
    (tokenizer_manager ``detokenize_top_logprobs_tokens``); ``input_token_logprobs`` entries are single triples
    whose token ids must equal ``ids[start-1:]`` (checked here, so a misaligned server is caught).
    """
    try:
        meta = resp["meta_info"]
        tops = meta["input_top_logprobs"]
    except (KeyError, TypeError):
        raise ValueError("SGLang response has no meta_info.input_top_logprobs (return_logprob off?)") from None
    expected = len(ids) - (start - 1)
    if not isinstance(tops, list) or len(tops) != expected:
        raise ValueError(f"SGLang input_top_logprobs has {len(tops) if isinstance(tops, list) else 'no'} "
                         f"entries, expected {expected}")
    toks = meta.get("input_token_logprobs")
    if isinstance(toks, list) and len(toks) == expected:
        got = [e[1] for e in toks if isinstance(e, list | tuple) and len(e) >= 2]
        if got and got != list(ids[start - 1:]):
            raise ValueError("SGLang input_token_logprobs token ids do not match the ids sent")
    out: list[TopK] = []
    for j in range(1, expected):
        entry = tops[j]
        if not isinstance(entry, list) or not entry:
            raise ValueError(f"SGLang input_top_logprobs[{j}] is empty")
        out.append(truncate_topk({int(e[1]): float(e[0]) for e in entry}, k))
    return out



# --- one next token at a time: the decode-side KL method's wire format (pure) -----------------------------------
def sglang_next_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /generate: one greedy token with ``top_logprobs_num`` output log-probabilities."""
    return "/generate", {"input_ids": list(prefix), "return_logprob": True, "logprob_start_len": len(prefix) - 1,
                         "top_logprobs_num": k, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def parse_sglang_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped) from ``meta_info.output_top_logprobs[0]`` = [[logprob, token_id, text], ...];
    stopped = ``meta_info.finish_reason.type == "stop"``."""
    try:
        meta = resp["meta_info"]
        top = meta["output_top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        raise ValueError("SGLang response has no meta_info.output_top_logprobs[0]") from None
    if not isinstance(top, list) or not top:
        raise ValueError("SGLang output_top_logprobs[0] is empty")
    fin = meta.get("finish_reason")
    stopped = isinstance(fin, dict) and fin.get("type") == "stop"
    return truncate_topk({int(e[1]): float(e[0]) for e in top}, k), stopped


# --- KV-cache scales: SGLang 0.5.16's logic (wheel), rules in rules/kv-scales.toml ------------------------------
KV_SCALE_RULES_VERSION = "0.5.16"
# what SGLang's 'scaling factors of 1.0' line does not say (load_model_utils.py:L103-L108)
KV_UNSCALED_NOTE = (" (SGLang prints this whenever --quantization-param-path is absent; it does not report scales a "
                    "quantization method loaded from the checkpoint)")


def plan_sglang_kv_scales(req: KVScaleRequest) -> ScalePlan:
    """Which k/v scales SGLang will use for ``req``'s arm (EngineAdapter.plan_kv_scales)."""
    if req.kv == "fp8":
        req = replace(req, kv="fp8_e4m3")  # quantrack's fp8 is SGLang's fp8_e4m3 (rules/methods.toml)
    kv, ck = req.kv, req.read_checkpoint
    if kv in UNQUANTIZED_KV:
        return req.plan("kv-not-quantized")
    if kv == "fp8_e5m2":
        return req.plan("sglang-kv-e5m2-unscaled")
    if kv != "fp8_e4m3":
        return req.unknown("kv-dtype-unchecked", f"KV dtype {kv}: quantrack has not read how SGLang scales it")
    if req.flag("--quantization-param-path"):
        method = req.quantization_method()
        backend = (req.flag("--attention-backend") or "").lower()
        if backend == "triton" and not method:  # k_scale set, k_scale_float left None: decode graph capture fails
            return req.plan("sglang-kv-param-path-triton-crash", "--attention-backend triton, no quantization method")
        return req.plan("sglang-kv-param-path")
    if ck is not None and ck.has_scales:
        if (ck.model_type or "").lower() == "qwen2":
            return req.plan("sglang-kv-qwen2-checkpoint-scales-dropped",
                            f"{ck.scale_tensors} scale tensors in the checkpoint are not used")
        return req.plan("sglang-kv-checkpoint-scales-arch-unchecked", f"model_type {ck.model_type or 'unknown'}")
    if ck is None:
        return req.unknown("kv-checkpoint-unread",
                           f"the checkpoint was not read ({req.checkpoint_note()}): whether it carries k/v "
                           "scales is not known; with none SGLang uses 1.0",
                           rule("sglang-kv-unscaled-warned")["source"],
                           rule("sglang-kv-unscaled-warned").get("log_line"))
    return req.plan("sglang-kv-unscaled-warned")


class SglangAdapter(EngineAdapter):
    kind = "sglang"
    # with --enable-metrics (python/sglang/srt/metrics/collector.py); not yet checked against a live server
    metric_series: ClassVar[dict[str, tuple[str, ...]]] = {
        "kv_usage": ("sglang:token_usage",),
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "preemptions": ("sglang:num_retracted_reqs",),
        "prefix_hit_rate": ("sglang:cache_hit_rate",),
    }
    label = "SGLang"
    serving = Serving(default_port=30000, health_path="/health")
    memory = MemoryModel(gpu_share=True)
    install = Install(pip_requirement="sglang")
    loaded_fields = ("weights_gib", "kv_cache_tokens", "available_kv_gib")

    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        model = spec.arm.model or spec.model
        head = [spec.binary] if spec.binary else [sys.executable, "-m", "sglang.launch_server"]
        argv = head + ["--model-path", model, "--host", spec.host, "--port", str(spec.port)]
        return argv + sglang_flags(spec.arm) + spec.server_flags("--mem-fraction-static", "--context-length",
                                                                 "--tp-size")

    def score_prompt(self, post: Callable[[str, dict[str, Any]], Any], ids: Sequence[int], start: int,
                     k: int) -> list[dict[int, float]]:
        path, body = sglang_request(ids, start, k)
        return parse_sglang(post(path, body), ids, start, k)

    def next_token_request(self, prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        return sglang_next_request(prefix, k)

    def parse_next_token(self, resp: Any, k: int) -> tuple[dict[int, float], bool]:
        return parse_sglang_next(resp, k)

    kv_scale_rules_version = KV_SCALE_RULES_VERSION

    def plan_kv_scales(self, req: KVScaleRequest) -> ScalePlan | None:
        return plan_sglang_kv_scales(req)

    def observe_kv_scales(self, report: LogReport, lines: dict[str, tuple[int, str]]) -> KVScaleObservation | None:
        return observe_lines(report, lines, unscaled_note=KV_UNSCALED_NOTE)

    markers = MARKERS
    line_prefixes = LINE_PREFIXES
    fallback_rules = FALLBACK_RULES

    def parse_log(self, lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource,
                  source: str | None = None, extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
        return parse_sglang_log(lines, source, extra_rules)

    def predict_capacity(self, shape: ModelShape, gpu_memory_bytes: float, arm: Arm, kv: str,
                         settings: CapacitySettings) -> EnginePrediction:
        """SGLang's mem_fraction_static pool (quantrack.hardware.capacity.predict_sglang)."""
        from quantrack.hardware.capacity import predict_sglang, share_basis

        basis = share_basis(shape, gpu_memory_bytes, arm, kv, settings)
        return predict_sglang(self.kind, shape, arm, kv, gpu_memory_bytes, settings, basis)

    def establish_arm(self, report: LogReport) -> tuple[Arm | None, str]:
        """``--quantization`` of server_args or ``quant=`` of the load line name the weights' format.
        ``dtype=torch.bfloat16`` is the activation dtype, and ``quantization=None`` also describes a pre-quantized
        checkpoint, so neither establishes bf16 weights."""
        quant = (report.quantization or "").strip().lower()
        if quant == "none" and not report.extra.get("quant_from_load_line"):
            return None, ("SGLang's quantization=None is printed for a pre-quantized checkpoint too, and the dtype= "
                          "of its load line is the activation dtype: the weights' format is not in the log")
        return hf_arm(report, "no server_args line with quantization=")

    def query(self, base_url: str, timeout: float = 10.0) -> LiveFacts:
        """``/server_info`` first (the new name: the real 0.5.16 log says "Endpoint '/get_server_info'
        is deprecated ... Please use '/server_info' instead."), then ``/get_server_info``
        (listed in SGLang's native-API docs, sgl-project docs "SGLang Native APIs")."""
        import httpx

        base = base_url.rstrip("/")
        out: dict[str, Any] = {}
        with httpx.Client(timeout=timeout) as client:
            for path in ("/server_info", "/get_server_info"):
                r = client.get(f"{base}{path}")
                if r.status_code == 200:
                    out.update(parse_server_info(r.json()))
                    out["endpoint"] = path
                    break
        return LiveFacts(self.kind, base, out)
