"""llama.cpp adapter: ``llama-server`` argv (or quantrack's xllamacpp entry point when no binary is
on PATH), startup-log parser and live queries (``/props``, ``/v1/models``, ``/slots``, ``/metrics``).

Log format strings: engine-facts.md §1.4 (llama.cpp@0c1e57098); prefix ``M.SS.mmm.uuu L `` as
printed by the server in ``xllamacpp==2026.10.11549`` (§1.5, real logs in reference data: llamacpp-cpu).
Patterns match the text after the ``__func__:`` prefix, so plain and timestamped forms both parse.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from quantrack.arms import GGUF_TYPES, Arm
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
from quantrack.engines.kvplan import GGUF_KV_QUANTIZED, KVScaleRequest, ScalePlan, ScaleSource
from quantrack.engines.kvscale import KVScaleObservation
from quantrack.engines.logparse import (
    FileSource,
    Line,
    ReportBuilder,
    RuleSpec,
    done_when,
    parse_float,
    parse_int,
    scan,
    startup_only,
)
from quantrack.engines.runcheck import StartLine, run_rules, settle
from quantrack.engines.scoring import TopK, truncate_topk
from quantrack.errors import BadInput

if TYPE_CHECKING:
    from quantrack.hardware.capacity import CapacitySettings, EnginePrediction
    from quantrack.hardware.catalog import ModelShape

# -ctk/-ctv spellings come from the rulebook (rules/methods.toml, llama.cpp@0c1e57098:common/arg.cpp:L304-L323).
GPU_ONLY_WEIGHTS = {"fp8", "int8", "w4a16", "nvfp4"}


def llamacpp_kv(arm: Arm) -> str | None:
    """The -ctk/-ctv type for this arm (None = llama.cpp's default f16)."""
    if arm.weights in GPU_ONLY_WEIGHTS:
        raise BadInput(f"arm {arm.name!r}: weights {arm.weights} is a GPU format; llama.cpp serves GGUF files "
                       "(use F16/Q8_0/Q4_0 ... GGUF files)")
    from quantrack.engines.vllm import rulebook_flags

    from_rules = rulebook_flags("llamacpp", arm)  # spellings from rules/methods.toml
    return from_rules[from_rules.index("--cache-type-k") + 1] if "--cache-type-k" in from_rules else None


def llamacpp_options(spec: LaunchSpec) -> list[str]:
    """llama-server options (the same spellings the xllamacpp entry point accepts)."""
    model = spec.arm.model or spec.model
    opts = ["-m", str(model), "--host", spec.host, "--port", str(spec.port)]
    if spec.context_len:
        opts += ["-c", str(spec.context_len)]
    opts += ["-np", str(spec.parallel or 1)]
    kv = llamacpp_kv(spec.arm)
    if kv is not None:
        opts += ["--cache-type-k", kv, "--cache-type-v", kv]
        if kv not in ("f16", "f32", "bf16"):
            # a quantized V cache needs flash attention (llama.cpp@0c1e57098:src/llama-context.cpp:L3840-L3848)
            opts += ["-fa", "on"]
    opts += ["--metrics"]
    if spec.served_name:
        opts += ["--alias", spec.served_name]
    return opts + list(spec.arm.engine_args) + list(spec.extra_args)


# --- log patterns (engine-facts §1.4) ---------------------------------------------------------------
# before print_info (2025-01) the same facts came from llm_load_print_meta: "model ftype = IQ2_XSS - 2.0625 bpw",
# "model size = 11.44 GiB (2.10 BPW)" (github.com/ggml-org/llama.cpp/issues/5137)
_META = r"(?:print_info|llm_load_print_meta)"
_FILE_TYPE = re.compile(_META + r": (?:file type|model ftype)\s+= (.+?)\s*$")              # llama-model-loader.cpp:L1805
_FILE_SIZE = re.compile(_META + r": (?:file|model) size\s+= ([\d.]+) (MiB|GiB) \(([\d.]+) BPW\)")  # L1807, L1809
_PARAMS = re.compile(_META + r": model params\s+= ([\d.]+) ([KMBT])")                     # llama-model.cpp:L2161
_META_INT = re.compile(_META + r": (n_layer|n_head_kv|n_ctx_train|n_embd|n_head)\s+= (\d+)\s*$")
_TYPE_COUNT = re.compile(r"llama_model_loader: - type\s+(\w+):\s+(\d+) tensors")       # llama-model-loader.cpp:L825
# old builds: "llm_load_tensors:      CUDA0 buffer size =  5434.38 MiB" (github.com/ggml-org/llama.cpp/pull/6122)
_MODEL_BUF = re.compile(r"load_tensors:\s+(\S+) (?:model )?buffer size =\s+([\d.]+) MiB")  # llama-model.cpp:L1930
_OFFLOAD = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")           # llama-model.cpp:L1924
_CTX = re.compile(r"(?:llama_context|llama_new_context_with_model|llama_init_from_model|llama_model_load_internal): "
                  r"(n_ctx|n_ctx_seq|n_ctx_per_seq|n_seq_max|flash_attn|mla_attn|kv_unified|n_batch|n_ubatch)\s+= (\S+)")
# ^ llama-context.cpp:L309-L315; old prefixes: llama_new_context_with_model (PR 6122), llama_init_from_model (early 2025,
# llamacpp-lcppython1944-...), llama_model_load_internal (2023 GGML era, llamacpp-1956-...)
# "n_ctx_seq (16384) < n_ctx_train (163840) -- the full capacity of the model will not be utilized" (also n_ctx_per_seq)
_CTX_SEQ_WARN = re.compile(r"(n_ctx_seq|n_ctx_per_seq) \((\d+)\) < n_ctx_train")
# "llama_kv_cache_unified: kv_size = 4096, type_k = 'f16', ..." / "llama_kv_cache_init: kv_size = 4096, offload = 1,
# type_k = 'f16', type_v = 'f16', n_layer = 32" (2024-2025 builds): the cache's cells, i.e. the context it holds
_KV_SIZE = re.compile(r"llama_kv_cache(?:_init|_unified)?: kv_size = (\d+)(?:.*?type_k = '(\w+)', type_v = '(\w+)')?")
_OLD_FTYPE = re.compile(r"llama_model_load_internal: ftype\s+= \d+ \(mostly (\w+)\)")  # 2023 (llamacpp-1956-...)
# the MLA cache line (ik_llama.cpp, DeepSeek): "KV self size  = 1166.62 MiB, c^KV (q8_0): 1166.62 MiB, kv^T: not used"
_KV_SELF_MLA = re.compile(r"KV self size\s+=\s+([\d.]+) MiB, c\^KV \((\w+)\):\s+([\d.]+) MiB")
# 2023: "llama_new_context_with_model: kv self size  = 1024.00 MB" (llama.cpp's MB is MiB; llamacpp-3616-...)
_KV_SELF_OLD = re.compile(r"kv self size\s+=\s+([\d.]+) MB")
# old builds: "llama_new_context_with_model: KV self size  = 5120.00 MiB, K (f16): 2560.00 MiB, V (f16): 2560.00 MiB"
# (github.com/ggml-org/llama.cpp/pull/6122, /issues/5137)
_KV_SELF = re.compile(r"KV self size\s+=\s+([\d.]+) MiB, K \((\w+)\):\s+([\d.]+) MiB, V \((\w+)\):\s+([\d.]+) MiB")
# llama.cpp failures at start (ggml-cuda.cu alloc_buffer, llama-kv-cache / llama-context errors as printed in
# tests/data/public-logs: llamacpp-iklcpp749-..., llamacpp-lcppython1944-..., llamacpp-ollama6860-...)
_FAILURES: tuple[tuple[str, str], ...] = (
    ("cudaMalloc failed", "cuda_malloc_failed"),
    ("failed to allocate buffer for kv cache", "kv_cache_init_failed"),
    ("llama_kv_cache_init() failed", "kv_cache_init_failed"),
    ("failed to allocate compute buffers", "compute_buffer_alloc_failed"),
    ("failed to create context", "context_creation_failed"),
)
# devices other backends name: SYCL's table row "| 0|[level_zero:gpu:0]|  Intel(R) Arc(TM) A770 Graphics|  1.3|..."
# (llamacpp-6036-...), "Using device 0 (Intel(R) Arc(TM) A770 Graphics) as main device" (ollama PR 2458),
# "using device SYCL0 (Intel(R) Arc(TM) A770 Graphics) (unknown id) - 15473 MiB free" (llamacpp-20338-...),
# 2023 CUDA "Device 0: NVIDIA GeForce RTX 3090" without a capability (llamacpp-1956-...)
_SYCL_ROW = re.compile(r"^\|\s*\d+\|\s*\[[\w:]+gpu:\d+\]\|\s*(.+?)\|\s*[\d.]+\|")
_MAIN_DEV = re.compile(r"[Uu]sing device (\w+) \(((?:[^()]|\([^()]*\))+)\)(?: \([^()]*\))?(?: as main device| - (\d+) MiB "
                       r"free)")  # a name may hold "(R)" / "(TM)"; the optional "(0000:01:00.0)" / "(unknown id)" is the id
_BARE_DEV = re.compile(r"^\s*Device \d+: ([^,]+?)\s*$")
_FOUND_DEVS = re.compile(r"found (\d+) (CUDA|ROCm|SYCL|Vulkan) devices")
_PARALLEL = re.compile(r"setting n_parallel = (\d+) and kv_unified = (\w+)")  # llama-server 2025 (llamacpp-rocm5901-...)
# ik_llama.cpp / 2024 server JSON-ish lines: "INFO [ init] initializing slots | ... n_slots=1",
# "INFO [ init] new slot | ... id_slot=0 n_ctx_slot=32768" (llamacpp-iklcpp259-...)
_SLOTS_KV = re.compile(r"initializing slots \|.*?\bn_slots=(\d+)")
_SLOT_KV = re.compile(r"new slot \|.*?\bid_slot=(\d+) n_ctx_slot=(\d+)")
_ISWA = re.compile(r"creating (non-SWA|SWA) KV cache, size = (\d+) cells")  # github.com/ggml-org/llama.cpp/issues/14043
_KV_TOTAL = re.compile(                                                                # llama-kv-cache.cpp:L301
    r"llama_kv_cache: size =\s+([\d.]+) MiB \(\s*(\d+) cells,\s+(\d+) layers,\s+(\d+)/(\d+) seqs\), "
    r"K \((\w+)\):\s+([\d.]+) MiB, V \((\w+)\):\s+([\d.]+) MiB"
)
_KV_BUF = re.compile(r"llama_kv_cache(?:_init|_unified)?:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")  # llama-kv-cache.cpp:L291
_SLOTS = re.compile(r"initializing(?: slots)?, n_slots = (\d+)(?:, n_ctx_slot = (\d+))?")  # xllamacpp log; issue 17300
# per-slot lines: "slot   load_model: id  3 | task -1 | new slot, n_ctx = 1024" (github.com/ggml-org/llama.cpp/issues/23652);
# old server: " -> Slot 0 - max context: 512" (github.com/ggml-org/llama.cpp/pull/5104)
_SLOT_LINE = re.compile(r"(?:slot +\w+: id +(\d+) \| task -?\d+ \| new slot,? n_ctx(?:_slot)? = (\d+)|-> Slot (\d+) - max "
                        r"context: (\d+))")
_ROCM_DEV = re.compile(r"Device \d+: (.+?), (gfx\w+)")                                  # issue 18011 (HIP build)
_BUILD_INFO = re.compile(r"build_info: (\S+)")                                          # real xllamacpp log
# quantrack's xllamacpp wrapper (engines/xllamacpp_server.py version_line), printed first: the wheel's llama.cpp says
# "build_info: b0-unknown" (build 0, commit unknown), so the wheel's version is the one that identifies the engine
_XLLAMACPP_VERSION = re.compile(r"^quantrack-xllamacpp: (xllamacpp \S+)")
_NO_BUILD_INFO = re.compile(r"^b0-unknown$")  # llama.cpp built without its version (build number 0, no commit)
_BUILD = re.compile(r"\b(?:build(?::| =)|version:) (\d+ \([0-9a-f]+\))")  # "version: 5201 (85f36e5e)" (issue 13145)  # "main: build = 1971 (1182cf4d)" (issue 5137)
_CUDA_DEV = re.compile(r"Device \d+: (.+?),\s+compute capability (\d+\.\d+)")         # ggml-cuda.cu:L345
_USING_DEV = re.compile(r"using device (\S+) \((.+?)\)")                                # llama.cpp:L306
_CPU_DEV = re.compile(r"- CPU\s+: (.+?) \(\d+ MiB")                                     # real xllamacpp log
_FA_AUTO = re.compile(r"Flash Attention (enabled|not supported, set to disabled|was auto, set to disabled)")
# ^ llama-context.cpp:L550-L553; "was auto, set to disabled" (2026, llamacpp-lmstudio1454-...)
_FALLBACK_Q = re.compile(r"(\d+) of (\d+) tensor\(s\) required fallback quantization")  # llama-quant.cpp


# llama.cpp's line prefix: ``0.00.291.950 I text`` (xllamacpp / llama-server with timestamps), or none at all
LINE_PREFIXES = (
    LinePrefix("0123456789", re.compile(r"^(?P<ts>\d+\.\d\d\.\d\d\d\.\d\d\d) (?P<level>[DIWEN]) "),
               {"D": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "N": "INFO"}),
)

# --- detection (quantrack.engines.detect): lines that say llama.cpp wrote a log (and forks that keep its lines:
# ik_llama.cpp, llama-cpp-python, lemonade builds)
# Each marker names where it was seen: a format string (repo@sha:path:Lnn, engine-facts.md) or a public log kept
# verbatim in tests/data/public-logs/ (named by its file there); anchors: literals every match contains.
# fmt: off
MARKERS: tuple[Marker, ...] = (
    Marker("llamacpp", "llama.cpp loader", r"\bllama_model_loader: ", 6, "llama.cpp@0c1e57098:src/llama-model-loader.cpp:L825",
           ("llama_model_loader: ",)),
    Marker("llamacpp", "llama.cpp tensors", r"\b(?:llm_)?load_tensors: ", 5, "llama.cpp@0c1e57098:src/llama-model.cpp:L1924; llamacpp-6122-...",
           ("load_tensors: ",)),
    Marker("llamacpp", "llama.cpp model info", r"\b(?:print_info|llm_load_print_meta|llm_load_vocab|load_hparams): ", 5,
           "llama.cpp@0c1e57098:src/llama-model-loader.cpp:L1805; llamacpp-10560-...",
           ("print_info: ", "llm_load_print_meta: ", "llm_load_vocab: ", "load_hparams: ")),
    Marker("llamacpp", "llama.cpp context", r"\b(?:llama_context|llama_new_context_with_model|create_memory): ", 6,
           "llama.cpp@0c1e57098:src/llama-context.cpp:L309; iklcpp-237-mla-context.log",
           ("llama_context: ", "llama_new_context_with_model: ", "create_memory: ")),
    Marker("llamacpp", "llama.cpp KV cache", r"\bllama_kv_cache(?:_init|_unified(?:_iswa)?)?: ", 6,
           "llama.cpp@0c1e57098:src/llama-kv-cache.cpp:L301; llamacpp-lcpp1939-docker-prefix.log",
           ("llama_kv_cache",)),
    Marker("llamacpp", "ggml backend", r"\bggml_(?:cuda_init|metal_init|vulkan|backend|init)\w*:", 5, "llamacpp-18011-rocm-strix-device.log",
           ("ggml_",)),
    Marker("llamacpp", "llama.cpp server", r"\bsrv +\w+: |\bslot +\w+: id +\d+ \| task|Available slots:|-> Slot \d+ - max context", 5,
           "llamacpp-17300-server-4-slots.log, llamacpp-5104-old-server-slot.log",
           ("srv ", "slot ", "Available slots:", "-> Slot ")),
    Marker("llamacpp", "llama.cpp build", r"\b(?:main: )?build = \d+ \([0-9a-f]+\)|\bbuild_info: |\bllama-server\b|\bllama_perf_", 4,
           "llamacpp-5137-cpu-only-old.log",
           ("build = ", "build_info: ", "llama-server", "llama_perf_")),
    Marker("llamacpp", "GGUF", r"\bGGUF V\d\b|\.gguf\b", 2, "llamacpp-10560-old-print-meta.log",
           ("GGUF V", ".gguf")),
    Marker("llamacpp", "offloaded layers", r"offloaded \d+/\d+ layers to GPU", 4, "llama.cpp@0c1e57098:src/llama-model.cpp:L1924",
           ("layers to GPU",)),
    Marker("llamacpp", "Ollama (runs llama.cpp)", r'\bsource=\w+\.go:\d+ msg=|msg="(?:offload to \w+|starting llama server)"|'
           r"\bmsg=offload\b", 5, "tests/data/wild3/ollama-5913-rocm-offload-43of81.log",
           ("source=", "msg=")),
    Marker("llamacpp", "llama.cpp prefix", r"(?:^|\] )\d+\.\d\d\.\d\d\d\.\d\d\d [DIWEN] (?=\w)", 2,
           "llamacpp-23652-slots-n-ctx.log, xllamacpp reference logs",
           (" I ", " W ", " E ", " D ", " N ")),
)
# fmt: on

EXPECTED = (
    "engine_version", "weights_gib", "available_kv_gib", "kv_cache_tokens", "max_concurrency",
    "max_concurrency_context", "quantization", "attention_backend", "kv_cache_dtype",
)

_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def _file_type(b: ReportBuilder, ln: Line) -> None:
    m = _META_INT.search(ln.text)
    if m:
        b.extra(m.group(1), int(m.group(2)))
        return
    m = _FILE_TYPE.search(ln.text)
    if m:
        ftype = m.group(1).strip()
        b.extra("file_type", ftype)
        b.set("quantization", ftype.split(" - ")[0].replace("MOSTLY_", "").strip())
        return
    m = _FILE_SIZE.search(ln.text)
    if m:
        size = float(m.group(1))
        mib = size * 1024 if m.group(2) == "GiB" else size
        b.extra("file_size_mib", round(mib, 2))
        b.extra("bpw", float(m.group(3)))
        b.set("weights_gib", round(mib / 1024, 4))
        return
    m = _PARAMS.search(ln.text)
    if m:
        b.extra("model_params", int(float(m.group(1)) * _SCALE[m.group(2)]))


def _type_count(b: ReportBuilder, ln: Line) -> None:
    m = _TYPE_COUNT.search(ln.text)
    if m:
        types = b.report.extra.setdefault("tensor_types", {})
        types.setdefault(m.group(1), int(m.group(2)))


def _model_buf(b: ReportBuilder, ln: Line) -> None:
    m = _MODEL_BUF.search(ln.text)
    if m:
        # with tensor overrides (-ot exps=CPU) one device prints several buffer lines: its weights are their sum
        bufs = b.report.extra.setdefault("model_buffers_mib", {})
        bufs[m.group(1)] = round(bufs.get(m.group(1), 0.0) + float(m.group(2)), 2)
        if bufs[m.group(1)] != float(m.group(2)):
            b.report.extra.setdefault("model_buffer_lines", {}).setdefault(m.group(1), 1)
            b.report.extra["model_buffer_lines"][m.group(1)] += 1
        return



def _offload(b: ReportBuilder, ln: Line) -> None:
    """``offloaded N/M layers to GPU`` with N < M: part (or all) of the model runs on the CPU."""
    m = _OFFLOAD.search(ln.text)
    if not m or "offloaded_layers" in b.report.extra:
        return
    n, total = int(m.group(1)), int(m.group(2))
    b.extra("offloaded_layers", f"{n}/{total}")
    if n == 0:
        b.fallback("no_gpu_offload", ln)
    elif n < total:
        b.fallback("partial_gpu_offload", ln)


# Ollama's own (Go slog) lines, printed before it starts its llama.cpp runner (tests/data/wild3/ollama-5913-...):
# 'msg="offload to rocm" layers.requested=-1 layers.model=81 layers.offload=43 ... memory.required.kv="640.0 MiB"
# ... memory.weights.total="39.9 GiB"', and 'msg="starting llama server" cmd="... --ctx-size 2048 ..."'
_OLLAMA_OFFLOAD = re.compile(r"\blayers\.model=(\d+) layers\.offload=(\d+)")
_OLLAMA_MEM = re.compile(r'\bmemory\.(required\.kv|weights\.total)="([\d.]+) (MiB|GiB)"')
_OLLAMA_CTX = re.compile(r'msg="starting llama server" cmd=".*?--ctx-size (\d+)')


def _ollama(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _OLLAMA_OFFLOAD.search(t)
    if m and "offloaded_layers" not in b.report.extra:
        total, n = int(m.group(1)), int(m.group(2))
        b.extra("offloaded_layers", f"{n}/{total}")
        b.extra("offloaded_layers_source", "Ollama's offload line (layers.offload / layers.model)")
        if n == 0:
            b.fallback("no_gpu_offload", ln)
        elif n < total:
            b.fallback("partial_gpu_offload", ln)
    for key, val, unit in _OLLAMA_MEM.findall(t):
        gib = float(val) / 1024 if unit == "MiB" else float(val)
        b.extra("ollama_kv_gib" if key == "required.kv" else "ollama_weights_gib", round(gib, 4))
    m = _OLLAMA_CTX.search(t)
    if m:
        b.extra("n_ctx", int(m.group(1)))


def _override(b: ReportBuilder, ln: Line) -> None:
    """``Tensor blk.41.ffn_gate_exps.weight ... buffer type overriden to CPU``: weights placed on the CPU by a
    tensor override (-ot), whatever the offloaded-layers line says (tests/data/wild3/iklcpp-1532-...)."""
    if ln.text.rstrip().endswith("overriden to CPU") or ln.text.rstrip().endswith("overridden to CPU"):
        n = b.report.extra.get("tensors_overridden_to_cpu", 0) + 1
        b.report.extra["tensors_overridden_to_cpu"] = n
        if n == 1:
            b.warning("tensors_overridden_to_cpu", ln)


def _ctx(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _CTX.search(t)
    if m:
        key, val = m.group(1), m.group(2)
        key = "n_ctx_seq" if key == "n_ctx_per_seq" else key
        b.extra(key, parse_int(val) if key.startswith("n_") or key == "mla_attn" else val)
        if key == "flash_attn" and val in ("enabled", "disabled", "on", "off", "true", "false", "1", "0"):
            b.set("attention_backend", "flash_attn" if val in ("enabled", "on", "true", "1") else "standard")
        return
    m = _CTX_SEQ_WARN.search(t)
    if m:
        b.extra("n_ctx_seq", int(m.group(2)))
        return
    m = _OLD_FTYPE.search(t)
    if m:
        b.extra("file_type", f"mostly {m.group(1)}")
        b.set("quantization", m.group(1))
        return
    m = _KV_SELF.search(t)
    if m:
        total, ktype, kmib, vtype, vmib = float(m.group(1)), m.group(2), float(m.group(3)), m.group(4), float(m.group(5))
        _kv_line(b, ln, "KV self size line", total, {"k_type": ktype, "k_mib": kmib, "v_type": vtype, "v_mib": vmib})
        b.set("kv_cache_dtype", ktype if ktype == vtype else f"K={ktype},V={vtype}")
        return
    m = _KV_SELF_MLA.search(t)
    if m:
        _kv_line(b, ln, "KV self size line (MLA c^KV)", float(m.group(1)), {"k_type": m.group(2)})
        b.set("kv_cache_dtype", m.group(2))
        b.extra("mla_cache", True)
        return
    m = _KV_SELF_OLD.search(t)
    if m:
        _kv_line(b, ln, "kv self size line (MB = MiB)", float(m.group(1)), {})


def _kv_line(b: ReportBuilder, ln: Line, what: str, mib: float, parts: dict[str, Any], cells: int | None = None,
             layers: int | None = None) -> None:
    """One whole-cache line (a "size =" line, a "KV self size" line): collected, the cache chosen at the end
    (``_resolve_kv``)."""
    lines = b.report.extra.setdefault("_kv_lines", [])
    if len(lines) < 16:
        lines.append({"what": what, "mib": mib, "line_no": ln.no, "cells": cells, "layers": layers, **parts})
    b.extra("_kv_total_seen", True)


def _fa_auto(b: ReportBuilder, ln: Line) -> None:
    m = _FA_AUTO.search(ln.text)
    if m:
        b.set("attention_backend", "flash_attn" if m.group(1) == "enabled" else "standard", overwrite=True)
        if m.group(1).startswith("was auto"):
            # auto resolved to off: the attention runs without flash attention (degraded, not a substituted kernel)
            b.warning("flash_attn_auto_disabled", ln)


def _kv(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _KV_TOTAL.search(t)
    if m:
        total, cells, layers, seqs, streams = (float(m.group(1)), int(m.group(2)), int(m.group(3)),
                                               int(m.group(4)), int(m.group(5)))
        ktype, kmib, vtype, vmib = m.group(6), float(m.group(7)), m.group(8), float(m.group(9))
        _kv_line(b, ln, "llama_kv_cache size line", total,
                 {"k_type": ktype, "k_mib": kmib, "v_type": vtype, "v_mib": vmib, "seqs": seqs, "streams": streams},
                 cells=cells, layers=layers)
        b.extra("kv_cells_stated", cells * streams)  # the context the cache was built for, whatever its layers
        if layers > 0:
            b.set("kv_cache_dtype", ktype if ktype == vtype else f"K={ktype},V={vtype}")
        else:
            b.extra("_kv_zero_line", True)
        return
    m = _KV_BUF.search(t)
    if m:  # one line per device and cache: iSWA prints a non-SWA and a SWA buffer for the same device
        bufs = b.report.extra.setdefault("kv_buffers_mib", {})
        bufs[m.group(1)] = round(bufs.get(m.group(1), 0.0) + float(m.group(2)), 2)
        if m.group(1) == "CPU" and float(m.group(2)) > 0:
            b.extra("_kv_cpu_line", ln)
        return
    m = _ISWA.search(t)
    if m:
        b.extra("kv_cells_non_swa" if m.group(1) == "non-SWA" else "kv_cells_swa", int(m.group(2)))
        return
    m = _KV_SIZE.search(t)
    if m:
        b.extra("kv_size", int(m.group(1)))
        if m.group(2):
            b.set("kv_cache_dtype", m.group(2) if m.group(2) == m.group(3) else f"K={m.group(2)},V={m.group(3)}")


def _resolve_kv(r: LogReport) -> None:
    """Which KV line is the cache. Per-device KV buffers are what was allocated: their sum is the cache. A whole-cache
    line (a "size =" line, "KV self size") is used when no buffer line is in the log, or when it is larger than the
    buffers seen (the excerpt lost some devices' buffer lines). A "size =" line for 0 layers (an iSWA half that holds
    no layer) is not a cache; with iSWA the cache is both halves. Whatever was chosen is said in ``kv_mib_source``,
    and a line that disagrees is named there with why it was not used."""
    ex = r.extra
    lines = [x for x in ex.pop("_kv_lines", []) if x["layers"] is None or x["layers"] > 0]
    ex.pop("_kv_total_seen", None)
    bufs = ex.get("kv_buffers_mib") or {}
    buf_sum = round(sum(bufs.values()), 2) if bufs else None
    size_lines = [x for x in lines if x["what"] == "llama_kv_cache size line"]
    total_line = None
    if size_lines:  # iSWA prints one per half: the cache is their sum
        total_line = {"what": "llama_kv_cache size line" + (f"s ({len(size_lines)}, summed)" if len(size_lines) > 1
                                                             else ""),
                      "mib": round(sum(x["mib"] for x in size_lines), 2), "line_no": size_lines[0]["line_no"],
                      "cells": size_lines[0]["cells"], "parts": size_lines}
    elif lines:
        total_line = lines[0]
    tol = 0.01 * max(len(bufs), 1) + 0.05  # each buffer printed to 0.01 MiB
    chosen: float | None = None
    if buf_sum is not None:
        ex["kv_buffer_devices"] = len(bufs)
        if total_line is not None and total_line["mib"] > buf_sum + tol:
            chosen = total_line["mib"]
            ex["kv_mib_source"] = (f"{total_line['what']} (line {total_line['line_no']}): the per-device KV buffers "
                                   f"in the log sum to {buf_sum} MiB, less than the whole cache, so some devices' "
                                   "buffer lines are not in it")
        else:
            chosen = buf_sum
            src = f"sum of {len(bufs)} per-device KV buffer(s) ({', '.join(bufs)})"
            if total_line is not None and abs(total_line["mib"] - buf_sum) > tol:
                src += (f"; the {total_line['what']} (line {total_line['line_no']}) says {total_line['mib']} MiB, less "
                        "than the buffers allocated: it is not the whole cache")
            elif total_line is not None:
                src += f"; the {total_line['what']} (line {total_line['line_no']}) agrees ({total_line['mib']} MiB)"
            ex["kv_mib_source"] = src
    elif total_line is not None:
        chosen = total_line["mib"]
        ex["kv_mib_source"] = f"{total_line['what']} (line {total_line['line_no']}); no per-device buffer lines"
    if chosen is not None:
        ex["kv_mib"] = chosen
        r.available_kv_gib = round(chosen / 1024, 4)
        single = total_line if total_line is not None and len(total_line.get("parts", [total_line])) == 1 else None
        if single is not None:
            part = single.get("parts", [single])[0]
            for key in ("k_type", "k_mib", "v_type", "v_mib"):
                if part.get(key) is not None:
                    ex.setdefault(key, part[key])
    if size_lines and r.kv_cache_tokens is None:
        first = size_lines[0]
        streams = first.get("streams") or 1
        ex.update({"kv_cells": first["cells"], "kv_layers": sum(x["layers"] for x in size_lines),
                   "kv_seqs": first.get("seqs"), "kv_streams": streams})
        # cells are per stream: "512 cells x 4 streams" for 4 slots without a unified cache (engine-facts §1.5)
        r.kv_cache_tokens = int(first["cells"]) * int(streams)
    if chosen is not None and ex.get("kv_cells_non_swa") and not ex.get("kv_cells_swa"):
        # iSWA builds a non-SWA and a SWA cache; only the first one's lines are in the log: half a cache is not the cache
        ex["kv_mib_non_swa"] = chosen
        ex["kv_unknown_reason"] = (f"iSWA cache: only the non-SWA half's lines are in the log ({chosen} MiB); the SWA "
                                   "half's are not, so the whole cache is unknown")
        ex.pop("kv_mib", None)
        ex.pop("kv_mib_source", None)
        r.available_kv_gib = None
        return
    if chosen is None:
        why = ("the only llama_kv_cache size line holds 0 layers (an iSWA half with no layer is not the cache) and "
               "the other half's line is not in the log") if ex.get("_kv_zero_line") else \
            "no KV cache line (per-device KV buffer, size =, KV self size) in the log"
        ex["kv_unknown_reason"] = why
    ex.pop("_kv_zero_line", None)


def _slots(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _SLOTS.search(t) or _SLOTS_KV.search(t)
    if m:
        b.extra("n_slots", int(m.group(1)))
        b.set("max_concurrency", float(m.group(1)))
        if m.re is _SLOTS and m.group(2):
            b.set("max_concurrency_context", int(m.group(2)))
        return
    m = _SLOT_KV.search(t)
    if m:
        ids = b.report.extra.setdefault("_slot_ids", set())
        ids.add(int(m.group(1)))
        b.set("max_concurrency_context", int(m.group(2)))
        return
    m = _SLOT_LINE.search(t)
    if m:
        slot, n_ctx = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
        ids = b.report.extra.setdefault("_slot_ids", set())
        ids.add(int(slot))
        b.set("max_concurrency_context", int(n_ctx))
        return
    m = _PARALLEL.search(t)
    if m:
        b.extra("n_parallel", int(m.group(1)))
        b.extra("kv_unified", m.group(2))


def _xllamacpp_version(b: ReportBuilder, ln: Line) -> None:
    m = _XLLAMACPP_VERSION.search(ln.text)
    if m:
        b.set("engine_version", m.group(1), overwrite=True)  # in preference to llama.cpp's "b0-unknown"


def _build(b: ReportBuilder, ln: Line) -> None:
    m = _BUILD_INFO.search(ln.text) or _BUILD.search(ln.text)
    if m:
        b.set("engine_version", m.group(1))


def _device(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    m = _FOUND_DEVS.search(t)
    if m:
        b.extra("gpu_count", int(m.group(1)))
        b.extra("gpu_backend", m.group(2))
        return
    m = _CUDA_DEV.search(t)
    if m:
        b.set("gpu", m.group(1).strip())
        b.extra("compute_capability", m.group(2))
        return
    m = _ROCM_DEV.search(t)
    if m:
        b.set("gpu", m.group(1))
        b.extra("gpu_arch", m.group(2))
        return
    m = _MAIN_DEV.search(t)
    if m:
        b.set("gpu", m.group(2).strip(), overwrite=True)  # the device the model runs on, over a list's first entry
        if m.group(3):
            b.extra("device_free_mib", int(m.group(3)))
        return
    m = _SYCL_ROW.search(t)
    if m:
        b.set("gpu", m.group(1).strip())
        return
    m = _BARE_DEV.search(t)
    if m:
        b.set("gpu", m.group(1).strip())
        return
    m = _CPU_DEV.search(t)
    if m:
        b.extra("device", f"CPU: {m.group(1)}")


def _fallback_q(b: ReportBuilder, ln: Line) -> None:
    m = _FALLBACK_Q.search(ln.text)
    if m:
        b.extra("fallback_tensors", int(m.group(1)))
        b.fallback("gguf_fallback_quantization", ln)


def _errors(b: ReportBuilder, ln: Line) -> None:
    t = ln.text
    for needle, kind in _FAILURES:
        if needle in t:
            b.error(kind, ln)
            return
    if "GGML_ASSERT(" in t and t.rstrip().endswith("failed"):
        # ggml_abort's "%s:%d: GGML_ASSERT(%s) failed": the process aborts; before the server listens, the start failed
        b.error("ggml_assert_after_start" if b.report.extra.get("_listening") else "ggml_assert", ln)
        return
    if "retrying without pipeline parallelism" in t:
        b.warning("alloc_retried_without_pp", ln)  # the allocation errors before it did not end the start
    elif "quantized V cache requires flash_attn" in t or "requires Flash Attention" in t:
        b.error("quantized_v_cache_needs_flash_attn", ln)
    elif "Unsupported cache type" in t:
        b.error("unsupported_cache_type", ln)
    elif "failed to load model" in t or "error loading model" in t:
        b.error("model_load_failed", ln)
    elif ln.level == "ERROR" and len(b.report.errors) < 50:
        b.error("error", ln)


# KV lines are printed at start-up, all together: searched in the first two 4 MiB blocks, or until a whole-cache line
_KV_DONE = startup_only(2, "_kv_total_seen")
# Fallback and degraded-mode lines: looked for in every log, whatever engine was detected.
FALLBACK_RULES: list[RuleSpec] = [
    ("layers to GPU", _offload, startup_only(2, "offloaded_layers")),  # printed while the tensors load
    ("layers.offload=", _ollama, startup_only(2, "offloaded_layers")),
    ("buffer type overrid", _override, startup_only(2)),
    ("required fallback quantization", _fallback_q),
    # CPU fallbacks: ggml-cuda's "%s: failed to initialize CUDA: %s" (printed by ggml_cuda_init), and "warning: no
    # usable GPU found, --gpu-layers option will be ignored" as printed in llama.cpp's own CI logs (public code search)
    ("failed to initialize CUDA", lambda b, ln: b.fallback("cuda_init_failed_cpu", ln), startup_only()),
    ("no usable GPU found", lambda b, ln: b.fallback("no_usable_gpu_cpu", ln), startup_only()),
]
RULES: list[RuleSpec] = [
    *FALLBACK_RULES,
    ("print_info:", _file_type, done_when("file_type", "file_size_mib", "model_params", "n_ctx_train")),
    ("print_meta:", _file_type, done_when("file_type", "file_size_mib", "model_params", "n_ctx_train")),
    ("- type ", _type_count, done_when("file_type")),
    ("load_tensors:", _model_buf, _KV_DONE),
    ("llama_context:", _ctx, _KV_DONE),
    ("context_with_model:", _ctx, _KV_DONE),
    ("llama_init_from_model:", _ctx, _KV_DONE),
    ("llama_model_load_internal:", _ctx, startup_only()),
    ("< n_ctx_train", _ctx, startup_only()),
    ("Flash Attention", _fa_auto, done_when("attention_backend")),
    ("KV self size", _ctx, _KV_DONE),
    ("kv self size", _ctx, _KV_DONE),
    ("llama_kv_cache", _kv, _KV_DONE),
    ("n_slots =", _slots, done_when("n_slots")),
    ("n_slots=", _slots, done_when("n_slots")),
    ("new slot", _slots, done_when("n_slots")),
    ("-> Slot ", _slots, done_when("n_slots")),
    ("setting n_parallel", _slots, startup_only()),
    ('msg="starting llama server"', _ollama, startup_only()),
    ("quantrack-xllamacpp: xllamacpp ", _xllamacpp_version, startup_only()),
    ("build", _build, done_when("engine_version")),
    ("version: ", _build, done_when("engine_version")),
    ("Device ", _device, _KV_DONE),
    ("devices:", _device, startup_only()),
    ("sing device ", _device, startup_only()),
    ("|[", _device, startup_only(2, "gpu")),
    ("- CPU ", _device, _KV_DONE),
    ("enabling flash_attn since it is required", lambda b, ln: b.warning("flash_attn_forced_for_v_cache", ln),
     startup_only()),
    ("error", _errors),
    ("failed", _errors),
    ("retrying without pipeline parallelism", _errors, startup_only()),
    ("GGML_ASSERT(", _errors),
    ("server is listening on", lambda b, ln: b.extra("_listening", True)),  # "main: server is listening on http://..."
    ("Unsupported cache type", _errors, startup_only()),
    ("requires", _errors),
    (" E ", _errors),
]


# lines a llama.cpp launch prints once (quantrack.engines.runcheck: one log, one run)
START_LINES: tuple[StartLine, ...] = (("build", "main: build = ", "llama.cpp build line"),
                                      ("build", "build: ", "llama.cpp build line"))


def parse_llamacpp_log(lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource, source: str | None = None,
                       extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
    b = ReportBuilder("llamacpp", source, EXPECTED)
    scan(lines, b, [*RULES, *run_rules(START_LINES), *extra_rules])
    r = b.report
    slot_ids = r.extra.pop("_slot_ids", None)
    if slot_ids and "n_slots" not in r.extra:
        r.extra["n_slots"] = len(slot_ids)
        r.max_concurrency = float(len(slot_ids))
        r.extra.setdefault("derived", {})["n_slots"] = "distinct slot ids in the per-slot lines"
    kv_cpu = r.extra.pop("_kv_cpu_line", None)
    r.extra.pop("_listening", None)
    _resolve_kv(r)
    bufs_kv = r.extra.get("kv_buffers_mib") or {}
    if kv_cpu is not None and (any(d != "CPU" for d in bufs_kv) or r.extra.get("gpu_count")):
        # a GPU build (another device holds KV or a GPU was found) keeps KV cache in a CPU buffer: attention reads it
        # from host memory
        b.warning("kv_cache_on_cpu", kv_cpu)
    if r.kv_cache_tokens is None and "kv_mib" in r.extra and r.extra.get("n_ctx"):
        # builds without the "cells" line size the cache at n_ctx cells (llama.cpp of 2024)
        r.kv_cache_tokens = int(r.extra["n_ctx"])
        r.extra.setdefault("derived", {})["kv_cache_tokens"] = "n_ctx (old builds: one cell per context token)"
    bufs = r.extra.get("model_buffers_mib")
    if bufs:
        r.extra["model_buffers_total_mib"] = round(sum(bufs.values()), 2)
    if r.weights_gib is None and bufs:
        # no "file size" line: weights = the model buffers (a CPU_REPACK copy is counted too)
        r.weights_gib = round(sum(bufs.values()) / 1024, 4)
        r.extra.setdefault("derived", {})["weights_gib"] = "sum of model buffer sizes"
    if r.attention_backend is None and r.extra.get("flash_attn") == "auto":
        r.extra["flash_attn_resolved"] = "auto (result not printed)"
    ctx, basis = context_from_report(r)
    r.extra["context"] = ctx
    r.extra["context_source"] = basis
    report = b.finish()
    settle(report)
    return report


def context_from_report(r: LogReport) -> tuple[int | None, str]:
    """The context (KV cells for all sequences) the log states, and which line says so; None with the reason when no
    line states it (the model's training context is not the context a server ran with)."""
    ex = r.extra
    for key, what in (("n_ctx", "n_ctx"), ("kv_size", "kv_size (the KV cache's cells)"),
                      ("kv_cells_stated", "the KV cache size line's cells")):
        v = ex.get(key)
        if isinstance(v, int) and v > 0:
            return v, f"{what} in the log"
    seq, n_seq = ex.get("n_ctx_seq"), ex.get("n_seq_max")
    if isinstance(seq, int) and seq > 0:
        if isinstance(n_seq, int) and n_seq > 0:
            return seq * n_seq, "n_ctx_seq x n_seq_max in the log"
        return seq, "n_ctx_seq in the log (one sequence assumed: n_seq_max not in it)"
    per_slot, slots = r.max_concurrency_context, ex.get("n_slots")
    if per_slot and isinstance(slots, int):
        return int(per_slot) * slots, "the per-slot context x slots in the log"
    return None, ("unknown: the log states no context (no n_ctx, kv_size, n_ctx_seq, KV cache size or slot n_ctx "
                  "line); n_ctx_train is the model's training context, not the server's")


# --- live queries -------------------------------------------------------------------------------
def parse_props(obj: Any) -> dict[str, Any]:
    """Pure: llama-server ``/props`` JSON -> n_ctx, slots, model path, build."""
    if not isinstance(obj, dict):
        return {}
    out: dict[str, Any] = {}
    gen = obj.get("default_generation_settings")
    if isinstance(gen, dict) and "n_ctx" in gen:
        out["n_ctx_slot"] = gen.get("n_ctx")
    for key in ("total_slots", "model_path", "build_info", "chat_template_caps", "modalities"):
        if key in obj:
            out[key] = obj[key]
    if "build_info" in out and isinstance(out["build_info"], str) and _NO_BUILD_INFO.match(out["build_info"]):
        # not a version: the xllamacpp wheel's llama.cpp has no build number or commit (its startup log's
        # "quantrack-xllamacpp: xllamacpp X" line has the wheel's version)
        out["engine_version_unknown"] = (f"/props build_info is {out['build_info']!r} (llama.cpp built without its "
                                         "version, as in the xllamacpp wheel); the startup log names the wheel")
    elif "build_info" in out:
        out["engine_version"] = out.pop("build_info")
    out.pop("chat_template_caps", None)
    return out


def parse_slots(obj: Any) -> dict[str, Any]:
    """Pure: ``/slots`` JSON (a list of slots) -> count, per-slot context, busy slots."""
    if not isinstance(obj, list):
        return {}
    ctx = [s.get("n_ctx") for s in obj if isinstance(s, dict)]
    return {"slots": len(obj), "slot_n_ctx": ctx[0] if ctx else None,
            "slots_processing": sum(1 for s in obj if isinstance(s, dict) and s.get("is_processing"))}


def parse_llamacpp_metrics(text: str) -> dict[str, float]:
    """Pure: Prometheus text -> ``llamacpp:*`` gauges/counters (real: reference data: llamacpp-cpu/metrics-*.txt)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            v = parse_float(value.strip()) if value.strip() else None
            if v is None:
                try:
                    v = float(value)
                except ValueError:
                    continue
            out[name.removeprefix("llamacpp:")] = v
    return out


def parse_models_llamacpp(obj: Any) -> dict[str, Any]:
    """Pure: ``/v1/models`` JSON -> model id and the GGUF's n_ctx_train / size when given."""
    if not isinstance(obj, dict):
        return {}
    data = obj.get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict):
        meta = data[0].get("meta") or {}
        return {"model": data[0].get("id"), "n_ctx_train": meta.get("n_ctx_train"),
                "model_size_bytes": meta.get("size"), "n_params": meta.get("n_params")}
    return {}


def have_llama_server(binary: str | None = None) -> bool:
    return shutil.which(binary or "llama-server") is not None


# GGUF file types the log may name -> weights: the one table (quantrack.arms.GGUF_TYPES); an MXFP4 file type
# is not read from a log yet
_GGUF_WEIGHTS = {t: t for t in GGUF_TYPES if t != "mxfp4"}

# --- prompt-logprob scoring: the wire format (pure; checked against the engine source or a real response) ------
def llamacpp_tokenize_request(text: str, add_special: bool) -> tuple[str, dict[str, Any]]:
    """llama.cpp: {content, add_special} -> {tokens} (checked on the xllamacpp 2026.10.11549 server,
    tests/data/kl/llamacpp-tokenize.json)."""
    return "/tokenize", {"content": text, "add_special": add_special}


def llamacpp_request(prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
    """POST /completion for the distribution after ``prefix`` (one request per scored position).

    llama.cpp's server gives top-k log-probabilities only for generated tokens, so each position is one
    1-token generation from the growing prefix; ``cache_prompt`` lets the slot reuse the previous prefix (the
    server reports ``timings.cache_n = len(prefix) - 1``, ``prompt_n = 1``). ``post_sampling_probs: false``
    returns log-probabilities of the full softmax, before any sampler (identical at temperature 0 and 1.5 on
    xllamacpp 2026.10.11549; see docs/fidelity.md).
    """
    return "/completion", {"prompt": list(prefix), "n_predict": 1, "n_probs": k, "temperature": 0.0,
                           "cache_prompt": True, "post_sampling_probs": False}


def parse_llamacpp(resp: Any, k: int) -> TopK:
    """``completion_probabilities[0].top_logprobs`` = [{"id", "token", "bytes", "logprob"}, ...].

    Field names as returned by the llama.cpp server in xllamacpp 2026.10.11549 (real response stored in
    tests/data/kl/llamacpp-completion-nprobs.json).
    """
    try:
        top = resp["completion_probabilities"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("llama.cpp response has no completion_probabilities[0].top_logprobs "
                         "(n_probs ignored, or post_sampling_probs on?)") from None
    if not isinstance(top, list) or not top:
        raise ValueError("llama.cpp top_logprobs is empty")
    return truncate_topk({int(e["id"]): float(e["logprob"]) for e in top}, k)



def parse_llamacpp_next(resp: Any, k: int) -> tuple[TopK, bool]:
    """(top-k, stopped) of the decode-side KL method's one-token request (``llamacpp_request``: cache_prompt on):
    ``parse_llamacpp`` plus ``stop_type == "eos"`` (llama.cpp server's /completion answer)."""
    return parse_llamacpp(resp, k), isinstance(resp, dict) and resp.get("stop_type") == "eos"


# --- KV-cache scales: llama.cpp's quantized KV types carry their own (rules/kv-scales.toml) ---------------------
def plan_llamacpp_kv_scales(req: KVScaleRequest) -> ScalePlan:
    """A quantized -ctk type has a scale per block of 32 values, written with the cache; anything else is not
    quantized (EngineAdapter.plan_kv_scales; no checkpoint is read for a GGUF)."""
    if req.kv in GGUF_KV_QUANTIZED or req.flag("--cache-type-k") in GGUF_KV_QUANTIZED:
        return req.plan("llamacpp-kv-block-scales", with_checkpoint=False)
    return req.plan("kv-not-quantized", with_checkpoint=False)


def observe_llamacpp_kv_scales(report: LogReport) -> KVScaleObservation:
    """llama.cpp prints no scale line: its quantized KV types (q8_0, q4_0, ...) carry a scale per block of 32 values,
    computed when the cache is written. The K/V types come from its ``llama_kv_cache: size = ... K (q8_0) ...`` line
    (llama.cpp@0c1e57098:src/llama-kv-cache.cpp:L301), which the llama.cpp parser already read."""
    k, v = report.extra.get("k_type"), report.extra.get("v_type")
    if not k or not v:
        return KVScaleObservation(ScaleSource.UNKNOWN, "no llama_kv_cache line with the K/V types in the log")
    kinds = f"K ({k}), V ({v})"
    if k in GGUF_KV_QUANTIZED or v in GGUF_KV_QUANTIZED:
        return KVScaleObservation(ScaleSource.DYNAMIC_PER_BLOCK, f"llama_kv_cache: {kinds}: a scale per block of 32 "
                                  "values, written with the cache", kv_dtype=report.kv_cache_dtype)
    return KVScaleObservation(ScaleSource.NOT_QUANTIZED, f"llama_kv_cache: {kinds}: not quantized",
                              kv_dtype=report.kv_cache_dtype)


class LlamacppAdapter(EngineAdapter):
    kind = "llamacpp"
    # observed from the xllamacpp 2026.10.11549 server started with --metrics: no KV-usage gauge, no preemptions
    metric_series: ClassVar[dict[str, tuple[str, ...]]] = {
        "running": ("llamacpp:requests_processing",),
        "waiting": ("llamacpp:requests_deferred",),
        "prompt_uncached": ("llamacpp:prompt_tokens_total",),
        "prompt_cached": ("llamacpp:prompt_tokens_cached_total",),
    }
    slots_path = "/slots"
    label = "llama.cpp"
    # /health: 200 with {"status": "ok"} once the model is loaded
    serving = Serving(default_port=8080, health_path="/health", health_needs_status_ok=True, local_file=True,
                      refuses_context_over_max=False)
    memory = MemoryModel(gpu_share=False, slots=True, full_context_kv=True)
    install = Install(quantrack_extra="[cpu]", needs_gpu=False, release_versions=False)
    server_timing = "llama.cpp timings.predicted_per_token_ms"
    loaded_fields = ("model_buffers_mib", "offloaded_layers", "kv_mib", "kv_cache_tokens", "n_slots")

    def serve_arm(self, spec: str) -> Arm:
        """``serve --arm q8_0``: a bare KV type names an f16 arm with that KV cache."""
        from quantrack.arms import KV_DTYPES, make_arm

        s = spec.strip().lower()
        if "=" not in s and s in KV_DTYPES and s != "auto":
            return make_arm(f"kv-{s}", weights="f16", kv=s)
        return super().serve_arm(spec)

    def side_server_spec(self, spec: LaunchSpec, util: float | None) -> LaunchSpec:
        """One slot and one thread: the candidate it runs beside keeps its own threads."""
        from dataclasses import replace

        side = super().side_server_spec(spec, util)
        return replace(side, extra_args=(*side.extra_args, "-t", "1"))

    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        """``llama-server`` when it is on PATH (or given), else the same options through
        ``python -m quantrack.engines.xllamacpp_server`` (llama.cpp's server from the xllamacpp wheel)."""
        opts = llamacpp_options(spec)
        if spec.binary:
            return [spec.binary, *opts]
        if have_llama_server():
            return ["llama-server", *opts]
        return [sys.executable, "-m", "quantrack.engines.xllamacpp_server", *opts]

    def tokenize_request(self, text: str, add_special: bool = True,
                         model: str | None = None) -> tuple[str, dict[str, Any]]:
        """add_special: include BOS where the model uses one, as a text prompt would get."""
        return llamacpp_tokenize_request(text, add_special)

    def fixed_length_fields(self, max_tokens: int) -> dict[str, Any]:
        return {}  # ignore_eos alone: the server stops at n_predict = max_tokens

    def score_prompt(self, post: Callable[[str, dict[str, Any]], Any], ids: Sequence[int], start: int,
                     k: int) -> list[dict[int, float]]:
        """One request per position: llama.cpp returns the next-token top-k after the prompt only."""
        out = []
        for pos in range(start, len(ids)):
            path, body = llamacpp_request(ids[:pos], k)
            out.append(parse_llamacpp(post(path, body), k))
        return out

    def next_token_request(self, prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        return llamacpp_request(prefix, k)

    def parse_next_token(self, resp: Any, k: int) -> tuple[dict[int, float], bool]:
        return parse_llamacpp_next(resp, k)

    def plan_kv_scales(self, req: KVScaleRequest) -> ScalePlan | None:
        return plan_llamacpp_kv_scales(req)

    def observe_kv_scales(self, report: LogReport, lines: dict[str, tuple[int, str]]) -> KVScaleObservation | None:
        return observe_llamacpp_kv_scales(report)  # no scale lines: the K/V types of its cache line decide

    markers = MARKERS
    line_prefixes = LINE_PREFIXES
    fallback_rules = FALLBACK_RULES

    def parse_log(self, lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource,
                  source: str | None = None, extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
        return parse_llamacpp_log(lines, source, extra_rules)

    def predict_capacity(self, shape: ModelShape, gpu_memory_bytes: float, arm: Arm, kv: str,
                         settings: CapacitySettings) -> EnginePrediction:
        """The whole context's KV cells, allocated at start (quantrack.hardware.capacity.predict_llamacpp)."""
        from quantrack.hardware.capacity import predict_llamacpp

        return predict_llamacpp(self.kind, shape, arm, kv, settings)

    def establish_arm(self, report: LogReport) -> tuple[Arm | None, str]:
        """The GGUF file type names the weights; the K and V cache types the KV cache."""
        from quantrack.arms import make_arm

        quant = (report.quantization or "").strip().lower()
        kv_raw = (report.kv_cache_dtype or "auto").strip().lower()
        w = _GGUF_WEIGHTS.get(quant)
        if w is None:
            return None, (f"GGUF file type {report.quantization!r} is not one quantrack models" if quant else
                          "the log has no GGUF file type line (print_info: file type)")
        kv = kv_raw if "," not in kv_raw and kv_raw not in ("f16", "auto") else "auto"
        if "," in kv_raw:
            return None, f"K and V cache types differ ({report.kv_cache_dtype})"
        return make_arm(f"{w}-kv-{kv}" if kv != "auto" else w, weights=w, kv=kv, dtype="auto"), ""

    def query(self, base_url: str, timeout: float = 10.0) -> LiveFacts:
        """``/props``, ``/v1/models``, ``/slots``, ``/metrics``: llama-server's routes (ggml-org/llama.cpp
        tools/server README "API Endpoints"; all four answered 200 from the xllamacpp server here)."""
        import httpx

        base = base_url.rstrip("/")
        out: dict[str, Any] = {}
        with httpx.Client(timeout=timeout) as client:
            r = client.get(f"{base}/props")
            if r.status_code == 200:
                out.update(parse_props(r.json()))
            r = client.get(f"{base}/v1/models")
            if r.status_code == 200:
                out.update({k: v for k, v in parse_models_llamacpp(r.json()).items() if v is not None})
            r = client.get(f"{base}/slots")
            if r.status_code == 200:
                out.update(parse_slots(r.json()))
            r = client.get(f"{base}/metrics")
            if r.status_code == 200:
                out["metrics"] = parse_llamacpp_metrics(r.text)
        return LiveFacts(self.kind, base, out)
