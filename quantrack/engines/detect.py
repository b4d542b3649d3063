"""Which engine wrote a log: per-line scoring of every engine's markers, with the evidence.

Owns the marker catalogue and the decision rule. Each marker is a regular expression searched in every line
of the log's head (logger file names, process prefixes, message texts, error texts, banners), with a weight:
how strongly one occurrence says "this engine". A marker counts once per log (the first line it is seen on is
its evidence), so a TP-8 log that repeats one line eight times is not eight times more certain.

Decision: the engine with the highest score wins when it reaches ``MIN_SCORE`` and leads the runner-up by a
margin (``MARGIN`` points and ``RATIO`` times its score). Otherwise no engine is named: the caller says which
engines came closest and asks for ``--engine``. Markers are searched anywhere in a line (not anchored), so the
wrapper prefixes other programs add (``vLLM STDOUT: ``, docker compose ``llama-1  | ``, a ``[pid]``, a ``> ``
quote) do not hide them, and a few lines pasted from the middle of a log are enough.

Each marker names where it was seen: a format string (``repo@sha:path:Lnn``, engine-facts.md) or a public log
kept verbatim in tests/data/public-logs/ (named by its file there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MIN_SCORE = 3
MARGIN = 3
RATIO = 2.0
DETECT_BYTES = 1024 * 1024  # the head read for detection; a clear winner is almost always in the first lines
MAX_DETECT_BYTES = 8 * 1024 * 1024  # read on (block by block) while no engine is clear


@dataclass(frozen=True)
class Marker:
    engine: str
    label: str
    pattern: str
    weight: int
    source: str


# fmt: off
MARKERS: tuple[Marker, ...] = (
    # --- vLLM ------------------------------------------------------------------------------------------------
    # logger prefix "LEVEL MM-DD HH:MM:SS [file.py:NNN]" (V0 printed "file.py:NNN]" without "[")
    Marker("vllm", "vLLM log prefix", r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (?=\[?[\w.]+\.py:\d+\])", 3,
           "vllm@4ba787ec9:vllm/logger.py (_FORMAT); every vllm-*.log in tests/data/public-logs"),
    Marker("vllm", "vLLM logger file name", r"\[?\b(?:gpu_worker|worker|gpu_model_runner|model_runner|executor_base|kv_cache_utils|llm_engine|"
           r"distributed_gpu_executor|multiproc_executor|multiproc_worker_utils|marlin_utils_fp8|awq_marlin|gptq_marlin|"
           r"gpu_executor|ray_distributed_executor|async_llm_engine|enc_dec_model_runner|cuda_communicator|"
           r"default_loader|backends|monitor|core_client|api_server|arg_utils|parallel_state)\.py:\d+\]", 3,
           "vllm-13882-..., vllm-12126-..., vllm-sglang12887-marlin-fp8-line.log (tests/data/public-logs)"),
    Marker("vllm", "vLLM process prefix", r"\((?:VllmWorker(?:Process)?(?: TP\d+| rank=\d+)?|EngineCore(?:_DP\d+)?|APIServer|"
           r"Worker(?:_[TPD]P\d+)*|RayWorkerWrapper)(?: pid=\d+)", 4,
           "vllm-14447-..., vllm-32105-..., vllm-club3090-430-... (tests/data/public-logs)"),
    Marker("vllm", "vLLM engine banner", r"Initializing an? (?:V\d )?LLM engine", 8,
           "vllm@4ba787ec9:vllm/v1/engine/core.py:L140; vllm-2418-v02-banner-blocks.log"),
    Marker("vllm", "vLLM version line", r"vLLM API server version|vllm version \d", 8, "vllm@4ba787ec9 entrypoints"),
    Marker("vllm", "vLLM name", r"\bvLLM\b", 2, "vllm-unsloth2887-v085-wrapped-banner.log ('vLLM STDOUT: ')"),
    Marker("vllm", "vllm package path", r"[/\\]vllm[/\\](?:v1|engine|worker|executor|entrypoints|model_executor)[/\\]|"
           r"\bvllm\.entrypoints\b|\bvllm serve\b", 5, "vllm-31387-..., vllm-tpu223-... (tracebacks)"),
    Marker("vllm", "vLLM memory profile", r"model weights take|non_torch_memory|Memory profiling (?:results|takes)|"
           r"the current vLLM instance can use|reserved for KV Cache is", 4, "vllm-10511-..., vllm-12126-..."),
    Marker("vllm", "vLLM weight memory", r"Loading model weights took [\d.]+ GB|Model loading took [\d.]+ GiB", 4,
           "vllm@4ba787ec9:vllm/v1/worker/gpu_model_runner.py:L5089; vllm-12569-..."),
    Marker("vllm", "vLLM KV blocks", r"#? ?(?:GPU|CUDA|cuda) blocks: \d+", 4, "vllm-13596-v1-blocks-before.log, vllm-10517-..."),
    Marker("vllm", "vLLM KV tokens", r"(?:GPU|CUDA|XPU|TPU) KV cache size: [\d,]+ tokens", 4,
           "vllm@4ba787ec9:vllm/v1/core/kv_cache_utils.py:L1148"),
    Marker("vllm", "vLLM KV memory", r"Available KV cache memory: -?[\d.]+ GiB", 3, "vllm@4ba787ec9:vllm/v1/worker/gpu_worker.py:L773"),
    Marker("vllm", "vLLM concurrency line", r"Maximum concurrency for [\d,]+ tokens per request", 3,
           "vllm@4ba787ec9:vllm/v1/core/kv_cache_utils.py:L1148"),
    Marker("vllm", "vLLM max-model-len error", r"max seq len \(\d+\) is larger than the maximum number of tokens that can be "
           r"stored in KV cache|To serve at least one request with the models?'s max seq len", 5,
           "vllm-qwen295-maxlen-error.log, vllm-25350-fp8kv-too-small.log"),
    Marker("vllm", "vLLM bf16 error", r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0", 4,
           "vllm-substratus37-t4-bf16-error.log, vllm-pascal21-p40-bf16-error.log"),
    Marker("vllm", "vLLM capability error", r"GPUs with compute capability below 7\.0 are not supported", 2, "vllm-1284-p100-bf16-error.log"),
    Marker("vllm", "vLLM settings words", r"\bgpu_memory_utilization\b|\bmax_num_batched_tokens\b|\bVLLM_[A-Z_]+", 2,
           "vllm-qwen295-maxlen-error.log ('Try increasing `gpu_memory_utilization`')"),
    Marker("vllm", "vLLM AWQ/GPTQ forcing", r"Detected that the model can run with (?:awq|gptq)_marlin, however you specified", 4,
           "vllm-20112-awq-forced.log"),
    Marker("vllm", "vLLM CUDA-graph progress bar", r"Capturing CUDA graphs \((?:PIECEWISE|FULL|mixed prefill-decode|decode)", 3,
           "tests/data/logs/h200-util045/vllm-0.25.0-bf16.log (vLLM 0.25 tqdm bar)"),
    # shared with SGLang, which prints the same Marlin text: a weak hint for both
    Marker("vllm", "Marlin FP8 fallback text", r"does not have native support for FP8 computation", 1, "engine-facts §2.1"),
    # --- SGLang ----------------------------------------------------------------------------------------------
    Marker("sglang", "SGLang log prefix", r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]", 2, "sglang-29575-max-total-tokens.log"),
    Marker("sglang", "SGLang rank prefix", r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d (?:DP\d+ ?)?(?:PP\d+ ?)?(?:TP\d+)(?: ?EP\d+)?\]", 5,
           "sglang-11716-tp8-init.log; 0.3 printed the time only: sglang-1612-v03-runtime-time-prefix.log"),
    Marker("sglang", "SGLang batch lines", r"(?:Prefill|Decode) batch\. #(?:new-seq|running-req): \d+", 5,
           "sglang-1612-v03-runtime-time-prefix.log"),
    Marker("sglang", "SGLang server args", r"server_args=ServerArgs\(", 8, "sglang@v0.5.23:python/sglang/srt/server_args.py"),
    Marker("sglang", "SGLang scheduler summary", r"max_total_num_tokens=\d+", 6, "sglang@v0.5.23:python/sglang/srt/managers/scheduler.py:L1269"),
    Marker("sglang", "SGLang KV pool", r"KV Cache is allocated\.|Memory pool end\.|Mamba Cache is allocated\.", 6,
           "sglang@v0.5.23:python/sglang/srt/mem_cache/memory_pool.py:L2088"),
    Marker("sglang", "SGLang weight load", r"Load weight (?:begin|end)\.", 6, "sglang@v0.5.23:python/sglang/srt/model_executor/model_runner.py:L1373"),
    Marker("sglang", "SGLang init lines", r"Init torch distributed (?:begin|ends)|Capture (?:[\w ]+ )?(?:cuda|CUDA) graph (?:begin|end)|"
           r"Using KV cache dtype: |Scheduler hit an exception", 4, "sglang-11716-..., sglang-ktransformers1870-..."),
    Marker("sglang", "SGLang name", r"\bsglang\b|\bSGLang\b|--mem-fraction-static|\bmem_fraction_static\b|--allow-auto-truncate", 4,
           "sglang-4048-tp8-input-too-long.log ('--allow-auto-truncate')"),
    Marker("sglang", "SGLang CUDA-graph progress bar", r"Capturing (?:num tokens \(num_tokens=\d+ |batches \((?:bs=\d+ )?)avail_mem=", 3,
           "tests/data/logs/h200-util045/sglang-0.5.16-bf16.log (SGLang 0.5.16 tqdm bar)"),
    Marker("sglang", "Marlin FP8 fallback text", r"does not have native support for FP8 computation", 1, "engine-facts §2.1"),
    # --- llama.cpp (and forks that keep its lines: ik_llama.cpp, llama-cpp-python, lemonade builds) ------------
    Marker("llamacpp", "llama.cpp loader", r"\bllama_model_loader: ", 6, "llama.cpp@0c1e57098:src/llama-model-loader.cpp:L825"),
    Marker("llamacpp", "llama.cpp tensors", r"\b(?:llm_)?load_tensors: ", 5, "llama.cpp@0c1e57098:src/llama-model.cpp:L1924; llamacpp-6122-..."),
    Marker("llamacpp", "llama.cpp model info", r"\b(?:print_info|llm_load_print_meta|llm_load_vocab|load_hparams): ", 5,
           "llama.cpp@0c1e57098:src/llama-model-loader.cpp:L1805; llamacpp-10560-..."),
    Marker("llamacpp", "llama.cpp context", r"\b(?:llama_context|llama_new_context_with_model|create_memory): ", 6,
           "llama.cpp@0c1e57098:src/llama-context.cpp:L309; iklcpp-237-mla-context.log"),
    Marker("llamacpp", "llama.cpp KV cache", r"\bllama_kv_cache(?:_init|_unified(?:_iswa)?)?: ", 6,
           "llama.cpp@0c1e57098:src/llama-kv-cache.cpp:L301; llamacpp-lcpp1939-docker-prefix.log"),
    Marker("llamacpp", "ggml backend", r"\bggml_(?:cuda_init|metal_init|vulkan|backend|init)\w*:", 5, "llamacpp-18011-rocm-strix-device.log"),
    Marker("llamacpp", "llama.cpp server", r"\bsrv +\w+: |\bslot +\w+: id +\d+ \| task|Available slots:|-> Slot \d+ - max context", 5,
           "llamacpp-17300-server-4-slots.log, llamacpp-5104-old-server-slot.log"),
    Marker("llamacpp", "llama.cpp build", r"\b(?:main: )?build = \d+ \([0-9a-f]+\)|\bbuild_info: |\bllama-server\b|\bllama_perf_", 4,
           "llamacpp-5137-cpu-only-old.log"),
    Marker("llamacpp", "GGUF", r"\bGGUF V\d\b|\.gguf\b", 2, "llamacpp-10560-old-print-meta.log"),
    Marker("llamacpp", "offloaded layers", r"offloaded \d+/\d+ layers to GPU", 4, "llama.cpp@0c1e57098:src/llama-model.cpp:L1924"),
    Marker("llamacpp", "llama.cpp prefix", r"(?:^|\] )\d+\.\d\d\.\d\d\d\.\d\d\d [DIWEN] (?=\w)", 2,
           "llamacpp-23652-slots-n-ctx.log, xllamacpp reference logs"),
)
# fmt: on
from quantrack.engines import ENGINE_KINDS as ENGINES  # the one registry

# Literal strings one of which every match of a marker contains: the marker's regex runs only on text that holds one
# (a C-speed substring test), so detection costs a few microseconds per marker per block.
ANCHORS: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm", "vLLM log prefix"): ("INFO ", "WARNING ", "ERROR ", "DEBUG ", "CRITICAL "),
    ("vllm", "vLLM logger file name"): (".py:",),
    ("vllm", "vLLM process prefix"): (" pid=",),
    ("vllm", "vLLM engine banner"): ("LLM engine",),
    ("vllm", "vLLM version line"): ("vLLM API server version", "vllm version"),
    ("vllm", "vLLM name"): ("vLLM",),
    ("vllm", "vllm package path"): ("vllm",),
    ("vllm", "vLLM memory profile"): ("model weights take", "non_torch_memory", "Memory profiling",
                                      "the current vLLM instance", "reserved for KV Cache is"),
    ("vllm", "vLLM weight memory"): ("Loading model weights took", "Model loading took"),
    ("vllm", "vLLM KV blocks"): (" blocks: ",),
    ("vllm", "vLLM KV tokens"): ("KV cache size: ",),
    ("vllm", "vLLM KV memory"): ("Available KV cache memory",),
    ("vllm", "vLLM concurrency line"): ("Maximum concurrency for",),
    ("vllm", "vLLM max-model-len error"): ("max seq len",),
    ("vllm", "vLLM bf16 error"): ("Bfloat16 is only supported",),
    ("vllm", "vLLM capability error"): ("compute capability below 7.0",),
    ("vllm", "vLLM settings words"): ("gpu_memory_utilization", "max_num_batched_tokens", "VLLM_"),
    ("vllm", "vLLM AWQ/GPTQ forcing"): ("Detected that the model can run with",),
    ("vllm", "vLLM CUDA-graph progress bar"): ("Capturing CUDA graphs (",),
    ("vllm", "Marlin FP8 fallback text"): ("native support for FP8",),
    ("sglang", "SGLang log prefix"): ("[1", "[2"),
    ("sglang", "SGLang rank prefix"): (" TP",),
    ("sglang", "SGLang batch lines"): (" batch. #",),
    ("sglang", "SGLang server args"): ("server_args=ServerArgs(",),
    ("sglang", "SGLang scheduler summary"): ("max_total_num_tokens=",),
    ("sglang", "SGLang KV pool"): ("KV Cache is allocated", "Memory pool end", "Mamba Cache is allocated"),
    ("sglang", "SGLang weight load"): ("Load weight ",),
    ("sglang", "SGLang init lines"): ("Init torch distributed", " graph begin", " graph end", "Using KV cache dtype",
                                      "Scheduler hit an exception"),
    ("sglang", "SGLang name"): ("sglang", "SGLang", "mem-fraction-static", "mem_fraction_static",
                                "allow-auto-truncate"),
    ("sglang", "SGLang CUDA-graph progress bar"): ("Capturing num tokens (", "Capturing batches ("),
    ("sglang", "Marlin FP8 fallback text"): ("native support for FP8",),
    ("llamacpp", "llama.cpp loader"): ("llama_model_loader: ",),
    ("llamacpp", "llama.cpp tensors"): ("load_tensors: ",),
    ("llamacpp", "llama.cpp model info"): ("print_info: ", "llm_load_print_meta: ", "llm_load_vocab: ",
                                           "load_hparams: "),
    ("llamacpp", "llama.cpp context"): ("llama_context: ", "llama_new_context_with_model: ", "create_memory: "),
    ("llamacpp", "llama.cpp KV cache"): ("llama_kv_cache",),
    ("llamacpp", "ggml backend"): ("ggml_",),
    ("llamacpp", "llama.cpp server"): ("srv ", "slot ", "Available slots:", "-> Slot "),
    ("llamacpp", "llama.cpp build"): ("build = ", "build_info: ", "llama-server", "llama_perf_"),
    ("llamacpp", "GGUF"): ("GGUF V", ".gguf"),
    ("llamacpp", "offloaded layers"): ("layers to GPU",),
    ("llamacpp", "llama.cpp prefix"): (" I ", " W ", " E ", " D ", " N "),
}
_COMPILED = [(i, re.compile(m.pattern), ANCHORS[(m.engine, m.label)]) for i, m in enumerate(MARKERS)]


@dataclass
class Detection:
    """The outcome: ``engine`` (None when no engine is clear), the scores, the evidence lines of the winner
    (or of every candidate when there is none), and a one-line reason."""

    engine: str | None
    scores: dict[str, int]
    evidence: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    lines_scanned: int = 0

    @property
    def candidates(self) -> list[str]:
        """Engines with any score, best first."""
        return [k for k, v in sorted(self.scores.items(), key=lambda kv: -kv[1]) if v > 0]

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "method": "auto", "scores": dict(self.scores), "reason": self.reason,
                "candidates": self.candidates, "lines_scanned": self.lines_scanned}


def _evidence(found: dict[int, tuple[int, str]], engine: str, limit: int = 5) -> list[dict[str, Any]]:
    rows = [(MARKERS[i], no, line) for i, (no, line) in found.items() if MARKERS[i].engine == engine]
    rows.sort(key=lambda r: (-r[0].weight, r[1]))
    return [{"engine": m.engine, "marker": m.label, "weight": m.weight, "line_no": no, "line": line[:300],
             "source": m.source} for m, no, line in rows[:limit]]


class Scorer:
    """Incremental scoring over chunks of text (one pass, C-speed regex over each chunk)."""

    def __init__(self) -> None:
        self.found: dict[int, tuple[int, str]] = {}  # marker index -> (line number, line)
        self.lines = 0

    def feed(self, text: str) -> None:
        base = self.lines
        for idx, rx, anchors in _COMPILED:
            if idx in self.found or not any(a in text for a in anchors):
                continue
            m = rx.search(text)
            if m is None:
                continue
            start = m.start()
            ls = text.rfind("\n", 0, start) + 1
            le = text.find("\n", start)
            self.found[idx] = (base + text.count("\n", 0, start) + 1, text[ls: le if le >= 0 else len(text)].strip())
        self.lines = base + text.count("\n") + (0 if text.endswith("\n") or not text else 1)

    def scores(self) -> dict[str, int]:
        out = dict.fromkeys(ENGINES, 0)
        for i in self.found:
            out[MARKERS[i].engine] += MARKERS[i].weight
        return out

    def decide(self) -> Detection:
        scores = self.scores()
        ranked = sorted(ENGINES, key=lambda k: -scores[k])
        best, second = ranked[0], ranked[1]
        b, s = scores[best], scores[second]
        if b < MIN_SCORE:
            reason = ("no engine markers found" if b == 0 else
                      f"too few engine markers (best: {best} with {b} point{'s' if b != 1 else ''})")
            evidence = [e for k in ranked if scores[k] for e in _evidence(self.found, k, 2)]
            return Detection(None, scores, evidence, reason, self.lines)
        if b - s < MARGIN or b < RATIO * s:
            reason = f"no clear engine: {best} {b} points vs {second} {s}"
            evidence = [e for k in (best, second) for e in _evidence(self.found, k, 2)]
            return Detection(None, scores, evidence, reason, self.lines)
        return Detection(best, scores, _evidence(self.found, best), f"{best}: {b} points (next: {second} {s})",
                         self.lines)

    @property
    def clear(self) -> bool:
        return self.decide().engine is not None


def detect_text(text: str) -> Detection:
    """Detection over a whole text (tests, pasted excerpts)."""
    sc = Scorer()
    sc.feed(text)
    return sc.decide()


def detect_file(path: str) -> Detection:
    """Detection over a file's head, read in growing blocks (8 KiB, 32 KiB, ... up to ``MAX_DETECT_BYTES``)
    until an engine is clear: most logs name their engine in the first lines. Bounded memory whatever the size."""
    sc = Scorer()
    carry = b""
    read, size = 0, 8 * 1024
    with open(path, "rb") as fh:
        while read < MAX_DETECT_BYTES:
            chunk = fh.read(size)
            size = min(size * 4, DETECT_BYTES)
            if not chunk:
                if carry:
                    sc.feed(carry.decode("utf-8", errors="replace"))
                break
            read += len(chunk)
            block = carry + chunk
            cut = block.rfind(b"\n")
            if cut < 0:
                carry = block[-65536:]
                continue
            sc.feed(block[: cut + 1].decode("utf-8", errors="replace"))
            carry = block[cut + 1:]
            if sc.clear:
                break
    return sc.decide()


__all__ = ["ENGINES", "MARKERS", "Detection", "Marker", "Scorer", "detect_file", "detect_text"]
