"""vLLM adapter: ``vllm serve`` argv, startup-log parser (v0, v1 legacy, 0.25, 0.33 formats) and
live queries (``/version``, ``/v1/models``, ``/metrics``).

Log strings are matched on the text after vLLM's prefix; each pattern names the format string
it reads (engine-facts.md §1.1, §1.2, §2) or the real log it was taken from (reference data: vllm-h200).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from quantrack.arms import GGUF_ONLY_TYPES, Arm
from quantrack.engines import DEFAULT_UTIL
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
from quantrack.engines.kvplan import UNQUANTIZED_KV, KVScaleRequest, ScalePlan, ScaleSource, rule
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
from quantrack.errors import BadInput

if TYPE_CHECKING:
    from quantrack.hardware.capacity import CapacitySettings, EnginePrediction
    from quantrack.hardware.catalog import ModelShape

# --- arm -> flags -------------------------------------------------------------------------------
# Flag spellings per engine live in the rulebook (rules/methods.toml, quantrack.hardware.rulebook.engine_flags), each with
# its source; the adapters do not keep a second table.
GGUF_TYPES = frozenset(GGUF_ONLY_TYPES)  # an arm with these weights is a GGUF file (quantrack.arms: the one table)


def rulebook_flags(engine: str, arm: Arm) -> list[str]:
    """The arm's engine flags from the rulebook, as an argv fragment."""
    from quantrack.hardware.rulebook import engine_flags

    return [part for item in engine_flags(engine, arm).items() for part in item]


def vllm_flags(arm: Arm) -> list[str]:
    """The quantization / KV / dtype flags vLLM needs for this arm."""
    if arm.weights in GGUF_TYPES:
        raise BadInput(f"arm {arm.name!r}: weights {arm.weights} is a GGUF type; serve it with --engine llamacpp")
    return rulebook_flags("vllm", arm)


# --- log patterns -------------------------------------------------------------------------------
# "Initializing a V1 LLM engine (v%s) with config: %s" (vllm@4ba787ec9:vllm/v1/engine/core.py:L140);
# older: "Initializing an LLM engine (v0.6.1...) with config:" (github.com/pytorch/serve/pull/3343).
# 0.2/0.3 printed no version: "Initializing an LLM engine with config: model=..." (github.com/vllm-project/vllm/issues/2418)
_BANNER = re.compile(r"Initializing an? (?:V\d )?LLM engine(?: \(v?([^)]*)\))? with config:? ?(.*)")
_CFG = {k: re.compile(rf"(?:^|[\s,]){k}=([^,\s]+)") for k in
        ("dtype", "quantization", "kv_cache_dtype", "tensor_parallel_size", "pipeline_parallel_size",
         "data_parallel_size", "max_seq_len", "device_config", "block_size")}
_ASCII_VERSION = re.compile(r"\bversion (\d+\.\d+\.\d+\S*)")  # real 0.25 banner: "█  version 0.25.0"
_API_VERSION = re.compile(r"vLLM API server version (\S+)")
# "Model loading took %s GiB memory and %.6f seconds" (v0.33), "Model loading took %.4f GiB and" (v0.11),
# real 0.25: "Model loading took 14.96 GiB and 4.347068 seconds".
# V0 0.8 printed "GB" here: "Model loading took 0.4678 GB and 114.953146 seconds" (github.com/SystemPanic/vllm-windows/issues/6)
_WEIGHTS_V1 = re.compile(r"Model loading took ([\d.]+) Gi?B(?: memory)? and")
# v0: "Loading model weights took 30.7098 GB" (github.com/vllm-project/vllm/issues/12664)
_WEIGHTS_V0 = re.compile(r"Loading model weights took ([\d.]+) GB")
# v0 memory-profiling table (github.com/vllm-project/vllm/pull/14447, /pull/10511)
_PROF_WEIGHTS = re.compile(r"model weights take\s+([\d.]+)\s*GiB")
# v0.6.4 one-line form: "Memory profiling results: total_gpu_memory=23.58GiB ... kv_cache_size=3.81GiB
# gpu_memory_utilization=0.90" (github.com/vllm-project/vllm/issues/10517); the KV figure can be negative when the
# weights do not fit ("reserved for KV Cache is -1.05GiB", github.com/vllm-project/vllm/issues/13882).
_PROF_KV = re.compile(r"(?:the rest of the memory reserved for KV Cache is|available_kv_cache_memory|kv_cache_size=)"
                      r"\s*(-?[\d.]+)\s*GiB")
_PROF_TOTAL = re.compile(r"total_gpu_memory[=\s]+\(?([\d.]+)\s*GiB")
_PROF_UTIL = re.compile(r"gpu_memory_utilization[=\s]+\(?([\d.]+)")
_AVAIL_KV = re.compile(r"Available KV cache memory: (-?[\d.]+) GiB")  # negative: the weights did not fit (issue 23278)
# logger.info("non-default args: %s", non_default_args): a Python dict repr of the flags the user changed
# (vllm 0.25.0: vllm/entrypoints/serve/utils/api_utils.py:L273; real line in tests/data/logs/h200-util045).
_NON_DEFAULT = {k: re.compile(rf"'{k}': ([\d.]+)[,}}]") for k in
                ("gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "tensor_parallel_size",
                 "pipeline_parallel_size", "data_parallel_size", "max_model_len", "block_size")}
# the string settings of that line: 'quantization': 'modelopt', 'kv_cache_dtype': 'fp8', 'dtype': 'bfloat16'
# (tests/data/public-logs/vllm-club3090-612-..., vllm-51454-...); kv_cache_dtype takes any value the engine accepts
# (v0.33's CacheDType has 22, e.g. int8_per_token_head: vllm@4ba787ec9:vllm/config/cache.py:L44-L66)
_NON_DEFAULT_STR = {k: re.compile(rf"'{k}': '([^']+)'") for k in ("quantization", "kv_cache_dtype", "dtype")}
# vLLM <= 0.5 printed its parsed arguments instead: logger.info("args: %s", args), an argparse Namespace repr
# (tests/data/public-logs/vllm-functionary128-args-namespace-v03.log): key=value, strings quoted, None unset
_NAMESPACE = re.compile(r"\bargs: Namespace\((.*)")
_NS_FIELD = re.compile(r"(?:^|, )(\w+)=('[^']*'|[\w.]+)")
_NS_INT = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs",
           "max_num_batched_tokens", "max_model_len", "block_size")
# "Using max model len %s" (V1 config, tests/data/public-logs/vllm-24162-...)
_MAX_MODEL_LEN = re.compile(r"Using max model len (\d+)")
# "Chunked prefill is enabled with max_num_batched_tokens=%d." (vllm-24162-...)
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
# "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: %d" (vllm-20707-...)
_NUM_BLOCKS_INFO = re.compile(r"num_gpu_blocks is: (\d+)")
# V1 (2026) one-line memory summary (tests/data/public-logs/vllm-rayserve65486-...): "Free memory on device
# (78.66/79.18 GiB) on startup. Desired GPU memory utilization is (0.9, 71.26 GiB). Actual usage is 15.31 GiB for
# weight, ... Current kv cache memory in use is 54.45 GiB."
_MEM_SUMMARY = re.compile(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup\. Desired GPU memory "
                          r"utilization is \(([\d.]+), [\d.]+ GiB\)\. Actual usage is ([\d.]+) GiB for weight")
# the refusal (2025-2026): "Free memory on device cuda:0 (1.53/22.05 GiB) on startup is less than desired GPU memory
# utilization (0.9, 19.84 GiB)." (tests/data/wild3/vllm-33297-..., pytorch-175666-..., club3090-4-...)
_FREE_LESS = re.compile(r"Free memory on device(?: [\w:]+)? \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired "
                        r"GPU memory utilization \(([\d.]+), ([\d.]+) GiB\)")
_KV_IN_USE = re.compile(r"Current kv cache memory in use is (-?[\d.]+) GiB")
_ENGINE_CORE = re.compile(r"\bEngineCore(?:_DP)?_?(\d+)\b")
# "rank %d in world size %d is assigned as DP rank %d, PP rank %d, [PCP rank %d, ]TP rank %d, EP rank %d"
# (parallel_state.py; real line in github.com/vllm-project/vllm/pull/37505)
_WORLD = re.compile(r"rank (\d+) in world size (\d+) is assigned as DP rank (\d+), PP rank (\d+),(?: PCP rank \d+,)? "
                    r"TP rank (\d+)")
# "%s KV cache size: %s tokens[, Maximum concurrency for %s tokens per request: %.2fx]"
_KV_TOKENS = re.compile(r"(\w+(?: \+ host)?) KV cache size: ([\d,]+) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
# v0: "# GPU blocks: 10039, # CPU blocks: 1310" (github.com/vllm-project/vllm/pull/6234); later v0 builds name the
# device type: "# CUDA blocks: 6001, # CPU blocks: 1638" (github.com/vllm-project/vllm/pull/12126)
# V1 before PR 13596 printed blocks only: "# GPU blocks: 1381" (github.com/vllm-project/vllm/pull/12569); a paste can
# lose the leading "# " (github.com/vllm-project/vllm/issues/10517)
_GPU_BLOCKS = re.compile(r"(?:# )?(?:GPU|CUDA|cuda) blocks: (\d+)(?:, # CPU blocks: (\d+))?")
_GRAPH = re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) GiB")
_SELECTED = re.compile(r"Selected (\w+) for (\w+)")
_USING_KERNEL = re.compile(r"Using (\w+) for (mixed-precision linear|\w+LinearMethod|CompressedTensors\w+|\w+ GEMM)")
_ATTN = re.compile(
    r"Using (?:AttentionBackendEnum\.)?([\w\-. ]+?) (?:attention )?backend"
    r"(?: out of potential backends| on V1 engine|\.| \(selected)"
)
_KV_DTYPE_INFO = re.compile(r"Using (\S+) data type to store kv cache")
_DEVICE_FALLBACK = re.compile(r"Your device '?(.+?)'? \(with compute capability ([\d.]+)\) doesn't support (\S+?)\. "
                              r"Falling back to (\S+?) for compatibility")
_BF16_ERR = re.compile(r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0\. "
                       r"Your (.+?) GPU (?:has compute capability (\d+\.\d+)|does not have)")
_MIN_CAP = re.compile(r"is not supported for the current GPU\. Min(?:imum)? capability: (\d+)\. "
                      r"Current capability: (\d+)")
_MAX_LEN = re.compile(r"max seq len \((\d+)\)")
_KV_LIMIT = re.compile(r"stored in KV cache \((\d+)\)")
# V1: f"To serve at least one request with the models's max seq len ({max_model_len}), ({needed} GiB KV cache is
# needed, which is larger than the available KV cache memory ({available} GiB).[ Based on the available memory, the
# estimated maximum model length is {n}.]" (vllm/v1/core/kv_cache_utils.py; github.com/vllm-project/vllm/pull/16168)
_KV_TOO_SMALL = re.compile(r"max seq len \((\d+)\),? \(?([\d.]+) Gi?B KV cache is needed, which is larger than the "
                           r"available KV cache memory \(([\d.]+) Gi?B\)(?:\. Based on the available memory, the estimated "
                           r"maximum model length is (\d+))?")  # 0.8.2 printed "GB" (vllm-15617-...)
# torch: "CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capac(i)ty of 23.69 GiB of which 3.09 GiB is
# free." (github.com/vllm-project/vllm/issues/2140)
_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+) (GiB|MiB|KiB)\.? (?:\(?GPU (\d+)(?:;| has a total "
                  r"capac(?:i)?ty of) ([\d.]+) GiB)?")
_UNIT = {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 1024 / 1024}
# lines of the profile run (V0 worker.profile_run / determine_num_available_blocks; V1 profile_run ->
# _dummy_sampler_run with its dummy_metadata, github.com/vllm-project/vllm/issues/27508): an OOM after one is "profiling"
_PROFILE_PHASE = ("Memory profiling", "profile_run", "determine_num_available_blocks", "determine_available_memory",
                  "_initialize_kv_caches", "Starting profile run", "_dummy_sampler_run", "dummy_metadata")


# vLLM's line prefix: ``(EngineCore_DP0 pid=123) INFO 09-10 13:29:13 [file.py:123] text``, the process tag optional
# (its rank tags TP/PP/DP/rank= are recorded as ``*_size_seen``); V0 printed "file.py:56]" without the "["
LINE_PREFIXES = (
    # nested process tags: Ray Serve's "(ServeReplica:app pid=1) (EngineCore pid=2) (RayWorkerProc pid=3) (Worker
    # pid=3) INFO ..." (tests/data/public-logs/vllm-rayserve65486-nested-prefixes-kv-memory.log)
    LinePrefix("(", re.compile(
        r"^(?P<rank>(?:\([^()]{1,120}\)\s+){2,})"
        r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
        r"\[?(?P<src>[^\]\s]{1,120})\]\s?")),
    LinePrefix("(DIWEC", re.compile(
        r"^(?:\((?P<rank>[^)]{1,80})\)\s+)?"
        r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
        r"\[?(?P<src>[^\]\s]{1,120})\]\s?")),
    LinePrefix("(", re.compile(r"^\((?P<rank>[^)]{1,80})\)\s")),  # a process tag alone (the text's own format)
)

# vLLM's prefix further into a line, after another program's: a CI timestamp "[2025-03-10T15:07:20Z] ", Buildkite's
# "  | ", TorchServe's "... MODEL_LOG - ", FastChat's "| ERROR | stderr | ", an indent (tests/data/public-logs:
# vllm-14574-..., vllm-6234-..., vllm-qanything302-...); logparse.strip_prefix searches it in a line's head
EMBEDDED_PREFIXES = (re.compile(
    r"(?P<rank>(?:\([^()]{1,120}\)\s+)*)"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
    r"\[?(?P<src>[\w./-]{1,120}\.py:\d+)\]\s?"),)

# --- detection (quantrack.engines.detect): lines that say vLLM wrote a log
# Each marker names where it was seen: a format string (repo@sha:path:Lnn, engine-facts.md) or a public log kept
# verbatim in tests/data/public-logs/ (named by its file there); anchors: literals every match contains.
# fmt: off
MARKERS: tuple[Marker, ...] = (
    # logger prefix "LEVEL MM-DD HH:MM:SS [file.py:NNN]" (V0 printed "file.py:NNN]" without "[")
    Marker("vllm", "vLLM log prefix", r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (?=\[?[\w.]+\.py:\d+\])", 3,
           "vllm@4ba787ec9:vllm/logger.py (_FORMAT); every vllm-*.log in tests/data/public-logs",
           ("INFO ", "WARNING ", "ERROR ", "DEBUG ", "CRITICAL ")),
    Marker("vllm", "vLLM logger file name", r"\[?\b(?:gpu_worker|worker|gpu_model_runner|model_runner|executor_base|kv_cache_utils|llm_engine|"
           r"distributed_gpu_executor|multiproc_executor|multiproc_worker_utils|marlin_utils_fp8|awq_marlin|gptq_marlin|"
           r"gpu_executor|ray_distributed_executor|async_llm_engine|enc_dec_model_runner|cuda_communicator|"
           r"default_loader|backends|monitor|core_client|api_server|arg_utils|parallel_state)\.py:\d+\]", 3,
           "vllm-13882-..., vllm-12126-..., vllm-sglang12887-marlin-fp8-line.log (tests/data/public-logs)",
           (".py:",)),
    Marker("vllm", "vLLM process prefix", r"\((?:VllmWorker(?:Process)?(?: TP\d+| rank=\d+)?|EngineCore(?:_DP\d+)?|APIServer|"
           r"Worker(?:_[TPD]P\d+)*|RayWorkerWrapper)(?: pid=\d+)", 4,
           "vllm-14447-..., vllm-32105-..., vllm-club3090-430-... (tests/data/public-logs)",
           (" pid=",)),
    Marker("vllm", "vLLM engine banner", r"Initializing an? (?:V\d )?LLM engine", 8,
           "vllm@4ba787ec9:vllm/v1/engine/core.py:L140; vllm-2418-v02-banner-blocks.log",
           ("LLM engine",)),
    Marker("vllm", "vLLM version line", r"vLLM API server version|vllm version \d", 8, "vllm@4ba787ec9 entrypoints",
           ("vLLM API server version", "vllm version")),
    Marker("vllm", "vLLM name", r"\bvLLM\b", 2, "vllm-unsloth2887-v085-wrapped-banner.log ('vLLM STDOUT: ')",
           ("vLLM",)),
    Marker("vllm", "vllm package path", r"[/\\]vllm[/\\](?:v1|engine|worker|executor|entrypoints|model_executor)[/\\]|"
           r"\bvllm\.entrypoints\b|\bvllm serve\b", 5, "vllm-31387-..., vllm-tpu223-... (tracebacks)",
           ("vllm",)),
    Marker("vllm", "vLLM memory profile", r"model weights take|non_torch_memory|Memory profiling (?:results|takes)|"
           r"the current vLLM instance can use|reserved for KV Cache is", 4, "vllm-10511-..., vllm-12126-...",
           ("model weights take", "non_torch_memory", "Memory profiling", "the current vLLM instance", "reserved for KV Cache is")),
    Marker("vllm", "vLLM weight memory", r"Loading model weights took [\d.]+ GB|Model loading took [\d.]+ GiB", 4,
           "vllm@4ba787ec9:vllm/v1/worker/gpu_model_runner.py:L5089; vllm-12569-...",
           ("Loading model weights took", "Model loading took")),
    Marker("vllm", "vLLM KV blocks", r"#? ?(?:GPU|CUDA|cuda) blocks: \d+", 4, "vllm-13596-v1-blocks-before.log, vllm-10517-...",
           (" blocks: ",)),
    Marker("vllm", "vLLM KV tokens", r"(?:GPU|CUDA|XPU|TPU) KV cache size: [\d,]+ tokens", 4,
           "vllm@4ba787ec9:vllm/v1/core/kv_cache_utils.py:L1148",
           ("KV cache size: ",)),
    Marker("vllm", "vLLM KV memory", r"Available KV cache memory: -?[\d.]+ GiB", 3, "vllm@4ba787ec9:vllm/v1/worker/gpu_worker.py:L773",
           ("Available KV cache memory",)),
    Marker("vllm", "vLLM concurrency line", r"Maximum concurrency for [\d,]+ tokens per request", 3,
           "vllm@4ba787ec9:vllm/v1/core/kv_cache_utils.py:L1148",
           ("Maximum concurrency for",)),
    Marker("vllm", "vLLM max-model-len error", r"max seq len \(\d+\) is larger than the maximum number of tokens that can be "
           r"stored in KV cache|To serve at least one request with the models?'s max seq len", 5,
           "vllm-qwen295-maxlen-error.log, vllm-25350-fp8kv-too-small.log",
           ("max seq len",)),
    Marker("vllm", "vLLM bf16 error", r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0", 4,
           "vllm-substratus37-t4-bf16-error.log, vllm-pascal21-p40-bf16-error.log",
           ("Bfloat16 is only supported",)),
    Marker("vllm", "vLLM capability error", r"GPUs with compute capability below 7\.0 are not supported", 2, "vllm-1284-p100-bf16-error.log",
           ("compute capability below 7.0",)),
    Marker("vllm", "vLLM settings words", r"\bgpu_memory_utilization\b|\bmax_num_batched_tokens\b|\bVLLM_[A-Z_]+", 2,
           "vllm-qwen295-maxlen-error.log ('Try increasing `gpu_memory_utilization`')",
           ("gpu_memory_utilization", "max_num_batched_tokens", "VLLM_")),
    Marker("vllm", "vLLM AWQ/GPTQ forcing", r"Detected that the model can run with (?:awq|gptq)_marlin, however you specified", 4,
           "vllm-20112-awq-forced.log",
           ("Detected that the model can run with",)),
    Marker("vllm", "vLLM CUDA-graph progress bar", r"Capturing CUDA graphs \((?:PIECEWISE|FULL|mixed prefill-decode|decode)", 3,
           "tests/data/logs/h200-util045/vllm-0.25.0-bf16.log (vLLM 0.25 tqdm bar)",
           ("Capturing CUDA graphs (",)),
    # shared with SGLang, which prints the same Marlin text: a weak hint for both
    Marker("vllm", "Marlin FP8 fallback text", r"does not have native support for FP8 computation", 1, "engine-facts §2.1",
           ("native support for FP8",)),
)
# fmt: on

EXPECTED = (
    "engine_version", "gpu", "weights_gib", "available_kv_gib", "kv_cache_tokens", "max_concurrency",
    "max_concurrency_context", "cuda_graph_gib", "quantization", "linear_kernel", "attention_backend",
    "kv_cache_dtype", "dtype",
)


def _banner(b: ReportBuilder, ln: Line) -> None:
    m = _BANNER.search(ln.text)
    if not m:
        return
    b.set("engine_version", (m.group(1) or "").lstrip("v") or None)
    cfg = m.group(2)
    for key, rx in _CFG.items():
        mm = rx.search(cfg)
        if not mm:
            continue
        val = mm.group(1)
        if key == "dtype":
            b.set("dtype", torch_dtype_short(val), overwrite=bool(b.report.extra.pop("_dtype_from_args", None)))
        elif key == "quantization":
            b.set("quantization", none_word(val), overwrite=bool(b.report.extra.pop("_quant_from_args", None)))
            b.report.extra["quantization_source"] = "the engine banner"
        elif key == "kv_cache_dtype":
            b.set("kv_cache_dtype", val, overwrite=bool(b.report.extra.pop("_kv_from_args", None)))
        elif key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            b.extra(key, parse_int(val))
        elif key == "max_seq_len":
            b.extra("max_model_len", parse_int(val))
        elif key == "device_config":
            b.extra("device", val)
        elif key == "block_size":
            b.extra("block_size", parse_int(val))


def _version(b: ReportBuilder, ln: Line) -> None:
    m = _API_VERSION.search(ln.text) or (_ASCII_VERSION.search(ln.text) if "█" in ln.text else None)
    if m:
        b.set("engine_version", m.group(1))


def _weights(b: ReportBuilder, ln: Line) -> None:
    for rx in (_WEIGHTS_V1, _WEIGHTS_V0, _PROF_WEIGHTS):
        m = rx.search(ln.text)
        if m:
            b.set("weights_gib", parse_float(m.group(1)))
            if rx is _WEIGHTS_V0:
                b.extra("weights_unit_note", "vLLM v0 prints 'GB' for GiB (bytes / 2**30)")
            return


def _non_default_args(b: ReportBuilder, ln: Line) -> None:
    for key, rx in _NON_DEFAULT.items():
        m = rx.search(ln.text)
        if m and b.report.extra.get(key) is None:
            b.extra(key, parse_float(m.group(1)) if key == "gpu_memory_utilization" else parse_int(m.group(1)))
    for key, rx in _NON_DEFAULT_STR.items():
        m = rx.search(ln.text)
        if m:
            _setting(b, key, m.group(1))


def _setting(b: ReportBuilder, key: str, value: str) -> None:
    """A setting the user passed (non-default args / args Namespace): kept as stated; the engine banner, printed
    later with what the engine resolved (awq -> awq_marlin), overwrites it."""
    if key == "quantization":
        if b.report.quantization is None:
            b.set("quantization", none_word(value))
            b.extra("_quant_from_args", True)
            b.extra("quantization_source", "the arguments line (what was passed, not what the engine resolved)")
    elif key == "kv_cache_dtype":
        if b.report.kv_cache_dtype is None:
            b.set("kv_cache_dtype", value)
            b.extra("_kv_from_args", True)
    elif key == "dtype" and value not in ("auto", "None"):
        b.set("dtype", torch_dtype_short(value))
        b.extra("_dtype_from_args", True)


def _namespace(b: ReportBuilder, ln: Line) -> None:
    m = _NAMESPACE.search(ln.text)
    if not m:
        return
    for key, raw in _NS_FIELD.findall(m.group(1)):
        if raw == "None":
            continue
        val = raw.strip("'")
        if key in _NS_INT:
            b.extra(key, parse_int(val))
        elif key == "gpu_memory_utilization":
            b.extra(key, parse_float(val))
        elif key in ("quantization", "kv_cache_dtype", "dtype"):
            _setting(b, key, val)
    if "quantization=None" in m.group(1):
        _setting(b, "quantization", "None")


def _settings_lines(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _MAX_MODEL_LEN.search(t)
    if m:
        b.extra("max_model_len", int(m.group(1)))
    m = _CHUNKED.search(t)
    if m:
        b.extra("max_num_batched_tokens", int(m.group(1)))
    m = _NUM_BLOCKS_INFO.search(t)
    if m:
        b.extra("num_gpu_blocks", int(m.group(1)))


def _mem_summary(b: ReportBuilder, ln: Line) -> None:
    m = _FREE_LESS.search(ln.text)
    if m:
        b.extra("free_memory_gib", parse_float(m.group(1)))
        b.extra("total_gpu_memory_gib", parse_float(m.group(2)))
        b.extra("gpu_memory_utilization", parse_float(m.group(3)))
        b.extra("requested_memory_gib", parse_float(m.group(4)))
        return
    m = _MEM_SUMMARY.search(ln.text)
    if m:
        b.extra("total_gpu_memory_gib", parse_float(m.group(2)))
        b.extra("gpu_memory_utilization", parse_float(m.group(3)))
        b.set("weights_gib", parse_float(m.group(4)))
    m = _KV_IN_USE.search(ln.text)
    if m:
        _kv_budget(b, ln, parse_float(m.group(1)))


def _kv_budget(b: ReportBuilder, ln: Line, gib: float | None) -> None:
    """A KV budget line (V0 profile table or one-liner, V1 "Available KV cache memory"). With several ranks the
    engine sizes the cache by the smallest (num_blocks = min over workers: engine-facts.md §4.1), so the report keeps
    the minimum; a budget at or below zero is a failed start (the weights left no memory for the cache)."""
    if gib is None:
        return
    per_rank = b.report.extra.setdefault("available_kv_gib_per_rank", [])
    if len(per_rank) < 64:
        per_rank.append(gib)
    b.set("available_kv_gib", min(per_rank), overwrite=True)
    if gib <= 0:
        b.error("negative_kv_budget", ln)


def _engine_core(b: ReportBuilder, ln: Line) -> None:
    m = _ENGINE_CORE.search(ln.rank or "")
    if m:
        cores = b.report.extra.setdefault("_engine_cores", set())
        cores.add(int(m.group(1)))
        cores.add(0)


def _profiling(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _PROF_KV.search(t)
    if m:
        _kv_budget(b, ln, parse_float(m.group(1)))
    m = _PROF_TOTAL.search(t)
    if m:
        b.extra("total_gpu_memory_gib", parse_float(m.group(1)))
    m = _PROF_UTIL.search(t)
    if m:
        b.extra("gpu_memory_utilization", parse_float(m.group(1)))
    if "model weights take" in t:
        _weights(b, ln)


def _avail_kv(b: ReportBuilder, ln: Line) -> None:
    m = _AVAIL_KV.search(ln.text)
    if m:
        _kv_budget(b, ln, parse_float(m.group(1)))


def _kv_tokens(b: ReportBuilder, ln: Line) -> None:
    m = _KV_TOKENS.search(ln.text)
    if m:
        b.set("kv_cache_tokens", parse_int(m.group(2)))
        b.extra("kv_cache_device", m.group(1))
    _max_conc(b, ln)


def _max_conc(b: ReportBuilder, ln: Line) -> None:
    m = _MAX_CONC.search(ln.text)
    if m:
        b.set("max_concurrency_context", parse_int(m.group(1)))
        b.set("max_concurrency", parse_float(m.group(2)))


def _gpu_blocks(b: ReportBuilder, ln: Line) -> None:
    m = _GPU_BLOCKS.search(ln.text)
    if m:
        b.extra("num_gpu_blocks", int(m.group(1)))
        if int(m.group(1)) == 0:  # no block for the KV cache: V0 then raises "No available memory for the cache blocks"
            b.error("no_kv_memory", ln)
        if m.group(2):
            b.extra("num_cpu_blocks", int(m.group(2)))


def _graph(b: ReportBuilder, ln: Line) -> None:
    m = _GRAPH.search(ln.text)
    if m:
        b.set("cuda_graph_gib", parse_float(m.group(1)))


_SCALE_DTYPE = re.compile(r"Using KV cache scaling factor 1\.0 for (fp8\w*)")


def _kv_scale_dtype(b: ReportBuilder, ln: Line) -> None:
    m = _SCALE_DTYPE.search(ln.text)
    if m:
        b.set("kv_cache_dtype", m.group(1))


def _kernel(b: ReportBuilder, ln: Line) -> None:
    m = _SELECTED.search(ln.text) or _USING_KERNEL.search(ln.text)
    if not m:
        return
    b.set("linear_kernel", m.group(1))
    b.extra("linear_method", m.group(2))
    if m.group(2).startswith("CompressedTensors") and b.report.quantization is None:
        # "Using MarlinLinearKernel for CompressedTensorsWNA16": the scheme class names the checkpoint's format
        b.set("quantization", "compressed-tensors")
        b.report.extra.setdefault("derived", {})["quantization"] = f"the scheme in the kernel line ({m.group(2)})"
    if m.group(1).startswith("MarlinFP8"):
        b.extra("_marlin_line", ln)


def _attention(b: ReportBuilder, ln: Line) -> None:
    if "MoE" in ln.text:
        return
    m = _ATTN.search(ln.text)
    if m:
        b.set("attention_backend", m.group(1).strip())


def _kv_dtype(b: ReportBuilder, ln: Line) -> None:
    m = _KV_DTYPE_INFO.search(ln.text)
    if m:
        b.set("kv_cache_dtype", m.group(1), overwrite=True)


def _device_fallback(b: ReportBuilder, ln: Line) -> None:
    m = _DEVICE_FALLBACK.search(ln.text)
    if m:
        b.set("gpu", m.group(1))
        b.extra("compute_capability", m.group(2))
        b.fallback("bf16_to_fp16", ln)


def _untuned_config(b: ReportBuilder, ln: Line) -> None:
    if "Using default MoE config. Performance might be sub-optimal" in ln.text:
        b.warning("moe_default_config", ln)
    elif "Using default W8A8 Block FP8 kernel config" in ln.text:
        b.warning("w8a8_block_fp8_default_config", ln)


def _falling_back(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    if "Falling back to unoptimized" in t or "Falling back to Moe WNA16" in t:
        b.fallback("layer_unoptimized_fallback", ln)
    else:
        _device_fallback(b, ln)


def _bf16_error(b: ReportBuilder, ln: Line) -> None:
    m = _BF16_ERR.search(ln.text)
    if m:
        b.set("gpu", m.group(1))
        if m.group(2):
            b.extra("compute_capability", m.group(2))
        b.error("bf16_unsupported_error", ln)


def _min_cap(b: ReportBuilder, ln: Line) -> None:
    m = _MIN_CAP.search(ln.text)
    if m:
        b.extra("min_capability", int(m.group(1)))
        b.extra("current_capability", int(m.group(2)))
        b.error("min_capability_error", ln)


def _max_len(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    if "KV cache" not in t:
        return
    v1 = _KV_TOO_SMALL.search(t)
    if v1:
        b.extra("max_model_len", int(v1.group(1)))
        b.extra("kv_needed_gib", float(v1.group(2)))
        b.set("available_kv_gib", float(v1.group(3)))
        b.extra("estimated_max_model_len", int(v1.group(4)) if v1.group(4) else None)
        if v1.group(4) is None:
            b.report.extra["estimated_max_model_len"] = None
        b.error("kv_cache_too_small", ln)
        return
    m = _MAX_LEN.search(t)
    if m:
        b.extra("max_model_len", int(m.group(1)))
        k = _KV_LIMIT.search(t)
        if k:
            b.extra("kv_tokens_limit", int(k.group(1)))
        b.error("max_model_len_exceeds_kv", ln)


def _oom(b: ReportBuilder, ln: Line) -> None:
    m = _OOM.search(ln.text)
    if m:
        b.extra("oom_tried_gib", round(float(m.group(1)) * _UNIT[m.group(2)], 4))
        if m.group(4):
            b.extra("oom_device_total_gib", float(m.group(4)))
    b.extra("oom_phase", "profiling" if b.report.extra.get("_profiling_seen") else "not stated")
    b.error("oom", ln)


def _profiling_seen(b: ReportBuilder, ln: Line) -> None:
    b.report.extra["_profiling_seen"] = True


def _world(b: ReportBuilder, ln: Line) -> None:
    m = _WORLD.search(ln.text)
    if m:
        b.extra("world_size", int(m.group(2)))


# a command line pasted into the log: "$ vllm serve meta-llama/Meta-Llama-3-8B -tp 2" (github.com/vllm-project/vllm/pull/10511)
_CMD_SIZES = {"tensor_parallel_size": re.compile(r"(?:\s-tp|--tensor[-_]parallel[-_]size)[ =](\d+)"),
              "pipeline_parallel_size": re.compile(r"(?:\s-pp|--pipeline[-_]parallel[-_]size)[ =](\d+)"),
              "data_parallel_size": re.compile(r"(?:\s-dp|--data[-_]parallel[-_]size)[ =](\d+)")}


def _command_line(b: ReportBuilder, ln: Line) -> None:
    for key, rx in _CMD_SIZES.items():
        m = rx.search(ln.text)
        if m:
            b.extra(key, int(m.group(1)))
            b.extra(f"{key}_source", "the vllm serve command line in the log")


def _rank(b: ReportBuilder, ln: Line) -> None:
    b.note_rank(ln)


def _below_70(b: ReportBuilder, ln: Line) -> None:
    b.extra("min_capability", 70)
    b.error("min_capability_error", ln)


def _generic_error(b: ReportBuilder, ln: Line) -> None:
    if ln.level in ("ERROR", "CRITICAL") and len(b.report.errors) < 50 and b.last_event_line != ln.no:
        b.error("error", ln)


def _simple(kind: str, bucket: str):  # type: ignore[no-untyped-def]
    def handler(b: ReportBuilder, ln: Line) -> None:
        b.event(bucket, kind, ln)
    return handler


_W = done_when("weights_gib")
_KVG = done_when("available_kv_gib")
_LK = done_when("linear_kernel")
# Fallback and degraded-mode lines (engine-facts §2.1-§2.5, plus the attention-backend fallbacks seen in public logs):
# looked for in every log, whatever engine was detected (quantrack.engines.parse_log_file).
FALLBACK_RULES: list[RuleSpec] = [
    ("does not have native support for FP8 computation", _simple("fp8_marlin", "fallbacks")),
    ("does not have native support for FP4 computation", _simple("fp4_marlin", "fallbacks")),
    ("explicitly, so forcing", _simple("awq_gptq_forced", "fallbacks")),
    # one keyword for the three "Falling back to ..." lines (one block search instead of three)
    ("Falling back to", _falling_back),
    # V0 selector: "Cannot use FlashAttention-2 backend for Volta and Turing GPUs." then "Using XFormers backend."
    # (tests/data/public-logs/vllm-jimw-v064-turing-opt125m-xformers.log)
    ("Cannot use FlashAttention-2 backend", _simple("attention_backend_fallback", "fallbacks"), startup_only()),
    # "--block-size %d precluded higher-priority backend(s) %s. Using %s instead" (vllm@4ba787ec9:vllm/platforms/cuda.py:L499)
    ("precluded higher-priority backend", _simple("attention_backend_fallback", "fallbacks"), startup_only()),
    ("Using KV cache scaling factor 1.0", _simple("kv_scale_uncalibrated", "warnings"), startup_only()),
    ("Using uncalibrated q_scale", _simple("q_scale_uncalibrated", "warnings"), startup_only()),
    # The encoder (ViT) attention falling back to xformers: logger.warning_once("Using xformers for ViT attention
    # backend. To use flash attention for ViT" "please install flash_attn") (github.com/vllm-project/vllm/pull/24347,
    # vllm/platforms/cuda.py): a slower kernel than the one the encoder would use, so a fallback
    ("Using xformers for ViT attention backend", _simple("vit_attention_xformers_fallback", "fallbacks"),
     startup_only(1)),
    # Degraded paths: the kernel asked for runs, in a slower mode; listed by audit as "degraded", not as a fallback
    # (no other kernel was substituted). Untuned Triton configs for this GPU and shape (vLLM fused_moe.py /
    # fp8_utils.py, SGLang prints the same text: tests/data/public-logs/vllm-17619-..., sglang-5675-...):
    ("Using default ", _untuned_config, startup_only(1)),
    # tensor-parallel all-reduce through NCCL instead of the custom kernel (custom_all_reduce.py, vllm-15340-...)
    ("Custom allreduce is disabled", _simple("custom_allreduce_disabled", "warnings"), startup_only(1)),
    # xformers without its C++/CUDA extensions: "Memory-efficient attention ... won't be available" (vllm-llamafactory5050-...)
    ("xFormers can't load C++/CUDA extensions", _simple("xformers_extensions_missing", "warnings"), startup_only(1)),
]

RULES: list[RuleSpec] = [
    ("LLM engine", _banner, done_when("engine_version", "dtype")),
    ("non-default args:", _non_default_args, startup_only()),
    ("args: Namespace(", _namespace, startup_only(1)),
    ("Using max model len", _settings_lines, startup_only(2, "max_model_len")),
    ("Chunked prefill is enabled", _settings_lines, startup_only(2, "max_num_batched_tokens")),
    ("num_gpu_blocks is:", _settings_lines, startup_only(2, "num_gpu_blocks")),
    ("Free memory on device", _mem_summary, startup_only(1)),
    # data-parallel engine cores without a DP tag ("(EngineCore_1 pid=..)", vllm-19954-...): only a second core's lines
    # are looked at (cheap on a long single-core log), so the count is the highest index seen + 1
    ("(EngineCore_1 ", _engine_core, startup_only(1)),
    # "EngineCore failed to start." / "EngineCore hit an exception: Traceback" (V1 core.py; vllm-17431-..., vllm-14574-...)
    ("EngineCore failed to start", _simple("engine_core_failed", "errors"), startup_only(1)),
    ("EngineCore hit an exception", _simple("engine_core_failed", "errors"), startup_only(1)),
    ("version ", _version, done_when("engine_version")),
    ("Model loading took", _weights, _W),
    ("Loading model weights took", _weights, _W),
    ("model weights take", _profiling, _W),
    ("reserved for KV Cache", _profiling, _KVG),
    ("available_kv_cache_memory", _profiling, _KVG),
    ("total_gpu_memory", _profiling, startup_only(2, "total_gpu_memory_gib")),
    ("gpu_memory_utilization ", _profiling, startup_only()),
    ("Available KV cache memory", _avail_kv, _KVG),
    ("KV cache size:", _kv_tokens, done_when("kv_cache_tokens", "max_concurrency")),
    ("Maximum concurrency for", _max_conc, done_when("max_concurrency")),
    ("GPU blocks:", _gpu_blocks, startup_only(2, "num_gpu_blocks")),
    ("CUDA blocks:", _gpu_blocks, startup_only(2, "num_gpu_blocks")),
    ("cuda blocks:", _gpu_blocks, startup_only(2, "num_gpu_blocks")),
    ("in world size", _world, startup_only()),
    ("vllm serve ", _command_line, startup_only()),
    ("_TP", _rank, lambda b: b.ranks_done()),
    ("VllmWorker TP", _rank, lambda b: b.ranks_done()),
    ("VllmWorker rank=", _rank, lambda b: b.ranks_done()),
    ("_PP", _rank, lambda b: b.ranks_done()),
    ("_DP", _rank, lambda b: b.ranks_done()),
    ("kv_cache_size=", _profiling, _KVG),
    ("Graph capturing finished", _graph, done_when("cuda_graph_gib")),
    ("Selected ", _kernel, _LK),
    (" for mixed-precision linear", _kernel, _LK),
    ("LinearMethod", _kernel, _LK),
    (" GEMM", _kernel, _LK),
    (" for CompressedTensors", _kernel, _LK),  # "Using MarlinLinearKernel for CompressedTensorsWNA16"
    ("backend", _attention, done_when("attention_backend")),
    ("data type to store kv cache", _kv_dtype, startup_only()),
    ("Bfloat16 is only supported", _bf16_error, startup_only()),
    # "RuntimeError: GPUs with compute capability below 7.0 are not supported." (github.com/vllm-project/vllm/issues/1284)
    ("compute capability below 7.0 are not supported", _below_70, startup_only()),
    ("not supported for the current GPU", _min_cap, startup_only()),
    ("max seq len", _max_len, startup_only()),
    *FALLBACK_RULES,
    # warnings (engine-facts §2.2, §2.3, §2.4)
    ("does not provide a q scaling factor", _simple("q_scale_missing", "warnings")),
    ("is deprecated and will be removed", _simple("deprecated_quantization", "warnings"), startup_only()),
    ("CUDA graph memory profiling is disabled", _simple("cudagraph_profiling_disabled", "warnings"), startup_only()),
    # errors
    ("on startup is less than desired GPU memory utilization", _simple("insufficient_free_memory", "errors"),
     startup_only()),
    ("Unknown quantization method", _simple("unknown_quantization", "errors"), startup_only()),
    # "Using KV cache scaling factor 1.0 for fp8_e4m3. ..." (quantization/kv_cache.py:L147-L152): names the KV dtype
    ("Using KV cache scaling factor 1.0 for ", _kv_scale_dtype, done_when("kv_cache_dtype")),
    # no linear kernel for the layer's quantization on this GPU: the model cannot be built ("Failed to find a kernel
    # that can implement the WNA16 / ScaledMM / NVFP4 linear layer. Reasons: ..." raised by vLLM's kernel choosers,
    # vllm/model_executor/kernels/linear/__init__.py of v0.24 as quoted in public code; the message as the title of
    # github.com/vllm-project/vllm/issues/23320 quotes it); "no kernel can implement" as the issue reports it
    ("a kernel that can implement the", _simple("no_kernel", "errors"), startup_only()),
    ("no kernel can implement", _simple("no_kernel", "errors"), startup_only()),
    ("CUDA out of memory", _oom),
    # V1: "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ..."
    # (github.com/vllm-project/vllm/issues/36861)
    ("No available memory for the cache blocks", _simple("no_kv_memory", "errors"), startup_only()),
    *[(k, _profiling_seen, startup_only()) for k in _PROFILE_PHASE],
    ("ERROR", _generic_error),
    ("CRITICAL", _generic_error),
]


# lines a vLLM launch prints once per process (quantrack.engines.runcheck: one log, one run)
START_LINES: tuple[StartLine, ...] = (
    ("version ", "vLLM API server version", "vLLM API server start"),
    ("non-default args:", "non-default args:", "vLLM arguments line"),
    ("LLM engine", "Initializing a", "vLLM engine banner"))


def parse_vllm_log(lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource, source: str | None = None,
                   extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
    """Parse a vLLM startup log (any supported version) into a LogReport, streaming.

    ``extra_rules``: more rules run in the same pass (the other engines' fallback catalogues)."""
    b = ReportBuilder("vllm", source, EXPECTED)
    scan(lines, b, [*RULES, *run_rules(START_LINES), *KV_SCALE_RULES, *extra_rules])
    r = b.report
    r.extra.pop("_profiling_seen", None)
    for key in ("_quant_from_args", "_kv_from_args", "_dtype_from_args"):
        r.extra.pop(key, None)
    cores = r.extra.pop("_engine_cores", None)
    if cores:
        r.extra["engine_cores_seen"] = max(cores) + 1
    if len(r.extra.get("available_kv_gib_per_rank", [])) < 2:
        r.extra.pop("available_kv_gib_per_rank", None)
    marlin = r.extra.pop("_marlin_line", None)
    if marlin is not None and not b.has_event("fp8_marlin"):
        b.fallback("fp8_marlin", marlin)
    # v0 logs give GPU blocks, not tokens: tokens = blocks x block size (derived, labelled).
    if r.kv_cache_tokens is None and "num_gpu_blocks" in r.extra:
        block = r.extra.get("block_size") or 16  # vLLM's CUDA default block size
        r.kv_cache_tokens = int(r.extra["num_gpu_blocks"]) * int(block)
        r.extra["derived"] = {"kv_cache_tokens": f"num_gpu_blocks x block_size ({block})"}
    if r.kv_cache_tokens is None and r.extra.get("kv_tokens_limit"):
        # V0's error "the maximum number of tokens that can be stored in KV cache (N)": N = blocks x block size
        r.kv_cache_tokens = int(r.extra["kv_tokens_limit"])
        r.extra.setdefault("derived", {})["kv_cache_tokens"] = "the max-model-len error's KV token figure"
    if r.max_concurrency_context is None and r.extra.get("max_model_len") and r.max_concurrency is not None:
        r.max_concurrency_context = r.extra["max_model_len"]
    report = b.finish()
    settle(report)
    return report


# --- the arm a vLLM or SGLang log establishes (quantization method names: vLLM's, which SGLang shares) -----------
_HF_WEIGHTS = {"fp8": "fp8", "fbgemm_fp8": "fp8", "ptpc_fp8": "fp8", "fp8_w8a8": "fp8", "modelopt": "fp8",
               "modelopt_fp4": "nvfp4", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "awq": "w4a16", "awq_marlin": "w4a16",
               "w8a8_int8": "int8", "experts_int8": "int8"}
_KV_WORDS = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "fp8_e4m3fn": "fp8_e4m3",
             "nvfp4": "nvfp4", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


def hf_arm(report: LogReport, no_quantization: str) -> tuple[Arm | None, str]:
    """The arm a Hugging Face checkpoint's log establishes (vLLM, SGLang): the quantization method's weights,
    the model dtype when unquantized, the KV-cache dtype (``auto`` where it is the activation dtype).
    ``no_quantization`` says which line was missing when the log names no quantization."""
    from quantrack.arms import make_arm

    quant = (report.quantization or "").strip().lower()
    kv_raw = (report.kv_cache_dtype or "auto").strip().lower()
    weights: str
    w: str | None
    if not quant:
        return None, f"the log names no quantization ({no_quantization})"
    if quant == "none":
        if report.dtype not in ("bf16", "fp16", "fp32"):
            return None, "unquantized, but the log names no model dtype"
        weights = str(report.dtype)
    else:
        w = _HF_WEIGHTS.get(quant)
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


# --- live queries -------------------------------------------------------------------------------
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, Any]:
    """Pure: vLLM's Prometheus text -> the cache_config_info labels that matter, typed.

    Real example: reference data: vllm-h200/metrics-*.txt (``vllm:cache_config_info{...} 1.0``).
    """
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = dict(_LABEL.findall(line[line.index("{"):line.rindex("}") + 1]))
        out["cache_config"] = labels
        for key, conv in (("kv_cache_size_tokens", parse_int), ("num_gpu_blocks", parse_int),
                          ("block_size", parse_int), ("kv_cache_max_concurrency", parse_float),
                          ("gpu_memory_utilization", parse_float)):
            if key in labels:
                out[key] = conv(labels[key])
        if "cache_dtype" in labels:
            out["cache_dtype"] = labels["cache_dtype"]
        break
    return out


def parse_models(obj: Any) -> dict[str, Any]:
    """Pure: ``/v1/models`` JSON -> served model id and max_model_len."""
    data = obj.get("data") if isinstance(obj, dict) else None
    if not data or not isinstance(data, list) or not isinstance(data[0], dict):
        return {}
    first = data[0]
    return {"model": first.get("id"), "max_model_len": first.get("max_model_len"), "root": first.get("root")}

# --- prompt-logprob scoring: the wire format (pure; checked against the engine source or a real response) ------
def vllm_request(ids: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /v1/completions scoring every prompt position of ``ids``.

    ``CompletionRequest.prompt`` accepts a list of token ids and ``prompt_logprobs: int`` asks for the top-k at
    every prompt position (vllm-project/vllm@002032ee2b18:vllm/entrypoints/openai/completion/protocol.py:L50
    prompt, :L96 prompt_logprobs). ``max_tokens`` 1: 0 is only allowed with ``echo`` (same file,
    ``to_sampling_params``: ``echo_without_generation``); one greedy token costs nothing next to the prefill.
    """
    return "/v1/completions", {"prompt": list(ids), "max_tokens": 1, "temperature": 0.0,
                               "prompt_logprobs": k, "add_special_tokens": False}


def parse_vllm(resp: Any, ids: Sequence[int], start: int, k: int) -> list[TopK]:
    """Top-k per position for ``ids[start:]`` from a vLLM completion response.

    ``CompletionResponseChoice.prompt_logprobs: list[dict[int, Logprob] | None]`` (same protocol.py), filled from
    ``final_res.prompt_logprobs`` (vllm/entrypoints/openai/completion/serving.py,
    ``request_output_to_completion_response``): entry j is the distribution that scored prompt token j (entry 0
    is null: nothing precedes it); each dict holds the top-k plus the scored token itself, as
    ``{"<id>": {"logprob", "rank", "decoded_token"}}`` (JSON object keys are strings).
    """
    try:
        plp = resp["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("vLLM response has no choices[0].prompt_logprobs (server too old?)") from None
    if not isinstance(plp, list) or len(plp) != len(ids):
        raise ValueError(f"vLLM prompt_logprobs has {len(plp) if isinstance(plp, list) else 'no'} entries, "
                         f"expected {len(ids)}")
    out: list[TopK] = []
    for j in range(start, len(ids)):
        entry = plp[j]
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"vLLM prompt_logprobs[{j}] is empty")
        out.append(truncate_topk({int(t): float(v["logprob"]) for t, v in entry.items()}, k))
    return out



# --- one next token at a time: the decode-side KL method's wire format (pure) -----------------------------------
def vllm_next_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /v1/completions: one greedy token, its top-k ``logprobs`` keyed ``token_id:<id>``
    (``return_tokens_as_token_ids``, vllm@dd10e03f9:vllm/entrypoints/openai/completion/protocol.py:L138-L145)."""
    return "/v1/completions", {"prompt": list(prefix), "max_tokens": 1, "temperature": 0.0, "logprobs": k,
                               "return_tokens_as_token_ids": True, "add_special_tokens": False}


def parse_vllm_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped) from ``choices[0].logprobs.top_logprobs[0]`` = {"token_id:<id>": logprob};
    stopped = finish_reason "stop" (an end-of-sequence token)."""
    try:
        choice = resp["choices"][0]
        top = choice["logprobs"]["top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        raise ValueError("vLLM response has no choices[0].logprobs.top_logprobs[0]") from None
    if not isinstance(top, dict) or not top:
        raise ValueError("vLLM top_logprobs[0] is empty")
    out: TopK = {}
    for key, lp in top.items():
        if not str(key).startswith("token_id:"):
            raise ValueError(f"vLLM top_logprobs key {key!r} is not token_id:<id> (return_tokens_as_token_ids ignored?)")
        out[int(str(key)[len("token_id:"):])] = float(lp)
    return truncate_topk(out, k), choice.get("finish_reason") == "stop"


# --- KV-cache scales: vLLM 0.25.0's logic (sdist, commit dd10e03f9), rules in rules/kv-scales.toml ----------------
KV_SCALE_RULES_VERSION = "0.25.0"
# vLLM's per-token-head KV dtypes (vllm@dd10e03f9:vllm/v1/kv_cache_interface.py:L63-L70)
PER_TOKEN_HEAD = ("fp8_per_token_head", "int8_per_token_head", "int4_per_token_head")


def plan_vllm_kv_scales(req: KVScaleRequest) -> ScalePlan:
    """Which k/v scales vLLM will use for ``req``'s arm (EngineAdapter.plan_kv_scales)."""
    kv, ck = req.kv, req.read_checkpoint
    scheme = ck.kv_cache_scheme if ck else None
    if kv in UNQUANTIZED_KV:
        if kv == "auto" and scheme is not None:
            return req.plan("vllm-kv-scheme-auto-fp8" if ck and ck.has_scales else "vllm-kv-scheme-no-scales",
                            kv="fp8")
        return req.plan("kv-not-quantized")
    if kv in PER_TOKEN_HEAD:
        return req.plan("vllm-kv-per-token-head")
    method = req.quantization_method()
    if kv == "fp8_e5m2":
        if method and not (method == "compressed-tensors" and scheme is None):
            return req.plan("vllm-kv-e5m2-quantized-checkpoint", f"quantization method {method!r}")
        backend = (req.flag("--attention-backend") or "").upper()
        if backend == "TRITON_ATTN":  # its impl quantizes the query on CUDA: the fp8* query path asserts
            return req.plan("vllm-kv-e5m2-query-quant", "--attention-backend TRITON_ATTN")
        return req.plan("vllm-kv-e5m2-unscaled")
    if "--calculate-kv-scales" in req.args:
        return req.plan("vllm-kv-calculate-scales")
    if ck is None:  # its quantization_config and scale tensors are unknown: so is the source
        return req.unknown("kv-checkpoint-unread",
                           f"the checkpoint was not read ({req.checkpoint_note()}): checkpoint scales or "
                           "1.0 cannot be told apart before launch; the log will say",
                           rule("vllm-kv-checkpoint-scales")["source"], rule("vllm-kv-unscaled-warned").get("log_line"))
    if not method:
        if ck.has_scales:
            return req.plan("vllm-kv-scales-without-method")
        return req.plan("vllm-kv-unscaled-silent")
    if ck.has_scales:
        return req.plan("vllm-kv-checkpoint-scales",
                        f"{ck.scale_tensors} scale tensors ({ck.scale_layout}, named {ck.scale_naming})")
    if scheme is not None:
        return req.plan("vllm-kv-scheme-no-scales")
    return req.plan("vllm-kv-unscaled-warned")


def vllm_kv_silence(q: str | None, covers_load: bool) -> tuple[ScaleSource, str]:
    """FP8 KV on vLLM without any KV-scale line: what the silence means, given the quantization and whether the log
    reaches past the weight loading (where vLLM prints its 'scaling factor 1.0' warning)."""
    if q is None:
        return ScaleSource.UNSCALED, ("FP8 KV with no quantization method (config banner quantization=None): vLLM has "
                                      "no KV method to load scales into, so they are the default 1.0 and it prints no "
                                      "scale line")
    if not covers_load:
        # the warning is printed once the weights are processed (after loading): a log cut before that point cannot
        # show its absence
        return ScaleSource.UNKNOWN, (f"quantization={q}, FP8 KV and no 'scaling factor 1.0' line, but the log stops "
                                     "before the weights were loaded (no 'Model loading took' or later figure), "
                                     "where that line would be printed: its absence proves nothing")
    return ScaleSource.CHECKPOINT, (f"quantization={q} and no 'scaling factor 1.0' line in a log that reaches past "
                                    "the weight loading: vLLM warns whenever both k and v scales are 1.0, so the "
                                    "scales came from the checkpoint")


class VllmAdapter(EngineAdapter):
    kind = "vllm"
    # V1 metrics (vllm/v1/metrics/loggers.py; vllm@v0.31.0 :677 names vllm:num_preemptions, exposed with _total)
    metric_series: ClassVar[dict[str, tuple[str, ...]]] = {
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
        "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
    }
    label = "vLLM"
    # /health: listed in the real 0.25 log ("Route: /health, Methods: GET")
    serving = Serving(default_port=8000, health_path="/health")
    # default share: vllm 0.25.0 vllm/config/cache.py:L68; the start check: vllm@4ba787ec9:vllm/v1/worker/utils.py:
    # L761-L770 (engine-facts §4.1)
    memory = MemoryModel(gpu_share=True, default_share=DEFAULT_UTIL, start_checks_share=True, profile_settings=True)
    install = Install(pip_requirement="vllm", cuda_gated=True)
    loaded_fields = ("weights_gib", "kv_cache_tokens", "available_kv_gib", "num_gpu_blocks", "kv_tokens_limit")

    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        model = spec.arm.model or spec.model
        argv = [spec.binary or "vllm", "serve", model, "--host", spec.host, "--port", str(spec.port)]
        return argv + vllm_flags(spec.arm) + spec.server_flags("--gpu-memory-utilization", "--max-model-len",
                                                               "--tensor-parallel-size")

    max_prompt_logprobs = 20  # vLLM --max-logprobs default

    def score_prompt(self, post: Callable[[str, dict[str, Any]], Any], ids: Sequence[int], start: int,
                     k: int) -> list[dict[int, float]]:
        path, body = vllm_request(ids, k)
        return parse_vllm(post(path, body), ids, start, k)

    def next_token_request(self, prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        return vllm_next_request(prefix, k)

    def parse_next_token(self, resp: Any, k: int) -> tuple[dict[int, float], bool]:
        return parse_vllm_next(resp, k)

    kv_scale_rules_version = KV_SCALE_RULES_VERSION

    def plan_kv_scales(self, req: KVScaleRequest) -> ScalePlan | None:
        return plan_vllm_kv_scales(req)

    def observe_kv_scales(self, report: LogReport, lines: dict[str, tuple[int, str]]) -> KVScaleObservation | None:
        return observe_lines(report, lines, silence=vllm_kv_silence)

    markers = MARKERS
    line_prefixes = LINE_PREFIXES
    embedded_prefixes = EMBEDDED_PREFIXES
    fallback_rules = FALLBACK_RULES

    def parse_log(self, lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource,
                  source: str | None = None, extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
        return parse_vllm_log(lines, source, extra_rules)

    def predict_capacity(self, shape: ModelShape, gpu_memory_bytes: float, arm: Arm, kv: str,
                         settings: CapacitySettings) -> EnginePrediction:
        """vLLM V1's profile-run budget (quantrack.hardware.capacity.predict_vllm)."""
        from quantrack.hardware.capacity import predict_vllm, share_basis

        basis = share_basis(shape, gpu_memory_bytes, arm, kv, settings)
        return predict_vllm(self.kind, shape, arm, kv, gpu_memory_bytes, settings, basis)

    def establish_arm(self, report: LogReport) -> tuple[Arm | None, str]:
        """Only the engine banner's ``quantization=`` names the weights' format. A quantization read from the
        arguments line stands in when no banner is in the log, except ``modelopt``: the banner says modelopt (FP8)
        or modelopt_fp4, the argument alone is either and the checkpoint decides."""
        quant = (report.quantization or "").strip().lower()
        if quant == "modelopt" and str(report.extra.get("quantization_source", "")).startswith("the arguments"):
            return None, ("quantization 'modelopt' from the arguments line: a ModelOpt checkpoint is FP8 or NVFP4 and "
                          "the engine banner, which would say which, is not in the log")
        return hf_arm(report, "no engine banner with quantization=")

    def query(self, base_url: str, timeout: float = 10.0) -> LiveFacts:
        """Live facts. Endpoints are vLLM's own routes, as listed by the server at start-up in the
        real 0.25 logs (``Route: /version``, ``Route: /v1/models``, ``Route: /metrics``)."""
        import httpx

        base = base_url.rstrip("/")
        out: dict[str, Any] = {}
        with httpx.Client(timeout=timeout) as client:
            r = client.get(f"{base}/version")
            if r.status_code == 200:
                out["engine_version"] = r.json().get("version")
            r = client.get(f"{base}/v1/models")
            if r.status_code == 200:
                out.update(parse_models(r.json()))
            r = client.get(f"{base}/metrics")
            if r.status_code == 200:
                out.update(parse_metrics(r.text))
        return LiveFacts(self.kind, base, out)

    @staticmethod
    def binary_available(binary: str | None = None) -> bool:
        return shutil.which(binary or "vllm") is not None
