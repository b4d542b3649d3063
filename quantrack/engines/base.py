"""The one interface every engine adapter implements (vLLM, SGLang, llama.cpp).

Adapters own everything engine-specific: flag spellings, the launch argv, the startup-log
format and the live endpoints. The rest of quantrack talks to engines only through this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from quantrack.arms import Arm


@dataclass
class LogEvent:
    """A fallback, warning or error found in a log: what kind, where, and the line itself."""

    kind: str
    line_no: int
    line: str


@dataclass
class LogReport:
    """What a startup log says. ``None`` means "not found in the log", never zero."""

    engine: str | None = None
    engine_version: str | None = None
    source: str | None = None  # file name
    gpu: str | None = None
    weights_gib: float | None = None
    available_kv_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_context: int | None = None
    cuda_graph_gib: float | None = None
    quantization: str | None = None
    linear_kernel: str | None = None
    attention_backend: str | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # engine-specific figures (llama.cpp K/V MiB ...)
    fallbacks: list[LogEvent] = field(default_factory=list)
    warnings: list[LogEvent] = field(default_factory=list)
    errors: list[LogEvent] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)  # names of the fields above the log did not give
    engine_evidence: list[dict[str, Any]] = field(default_factory=list)  # the lines that decided the engine
    detection: dict[str, Any] = field(default_factory=dict)  # how the engine was chosen (auto scores | given)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fell_back(self) -> bool:
        return bool(self.fallbacks)


@dataclass
class LaunchSpec:
    """Everything an adapter needs to build a launch command for one arm."""

    model: str  # what the engine serves (HF id / dir / GGUF file)
    arm: Arm
    host: str = "127.0.0.1"
    port: int = 8000
    context_len: int | None = None
    util: float | None = None  # vLLM --gpu-memory-utilization / SGLang --mem-fraction-static
    tp: int = 1
    parallel: int = 1  # llama.cpp slots (-np)
    served_name: str | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    binary: str | None = None

    def server_flags(self, util: str, context: str, tp: str) -> list[str]:
        """The memory / context / TP / served-name flags of a GPU server, under this engine's spellings;
        the arm's own args and the study's extra args come last, so they win."""
        out: list[str] = []
        if self.util is not None:
            out += [util, f"{self.util:g}"]
        if self.context_len:
            out += [context, str(self.context_len)]
        if self.tp and self.tp != 1:
            out += [tp, str(self.tp)]
        if self.served_name:
            out += ["--served-model-name", self.served_name]
        return out + list(self.arm.engine_args) + list(self.extra_args)


class EngineAdapter(ABC):
    """One per engine, registered by ``kind`` in ``quantrack.engines``."""

    kind: str = ""
    default_port: int = 8000
    # Facts the rest of quantrack asks of an engine (callers read these; none branches on ``kind``).
    label: str = ""  # how the engine is named to a user: "vLLM", "SGLang", "llama.cpp"
    health_path: str = "/health"
    health_needs_status_ok: bool = False  # the health body must also say {"status": "ok"} (llama.cpp)
    gpu_memory_share: bool = True  # takes a fraction of GPU memory (vLLM/SGLang); llama.cpp allocates what it needs
    serves_local_file: bool = False  # the model is one local file that must exist (a GGUF)
    has_slots: bool = False  # the KV cache is split into parallel slots (llama.cpp -np): capacity per slot
    server_timing: str | None = None  # where a server-side per-token time comes from, if the engine reports one
    needs_gpu: bool = True  # a fleet job reserves the study's GPUs for it (llama.cpp studies run on CPU nodes)
    pip_requirement: str | None = None  # the engine's own pip package, pinned per study ([engine] version)
    quantrack_extra: str = ""  # the quantrack extra a node installs for this engine ("[cpu]": xllamacpp)
    kv_type_names_arm: bool = False  # `serve --arm q8_0`: a bare KV type names an f16 arm with that KV cache
    release_versions: bool = True  # has release versions the rules compare (llama.cpp builds are numbered)
    default_util: float | None = None  # the engine's own default memory share, where it has one
    start_checks_memory_share: bool = False  # refuses to start unless free memory >= its share of the total:
    #                                          two servers on one GPU need shares that add up to <= 1
    cuda_gated: bool = False  # rules gate on the CUDA its wheels were built with (--cuda)
    # LogReport fields (or extra keys) printed only once the weights are on the device, where fallback lines
    # are printed: a log without any of them cannot rule a fallback out
    loaded_fields: tuple[str, ...] = ("weights_gib", "kv_cache_tokens")
    refuses_context_over_max: bool = True  # refuses a context above the model's maximum (llama.cpp runs it)
    allocates_full_context_kv: bool = False  # allocates the KV cache of the whole context at start (llama.cpp)
    profile_settings: bool = False  # max_num_batched_tokens / max_num_seqs shape its memory profile run

    max_prompt_logprobs: int | None = None  # the most top-k log-probabilities per prompt position by default
    # the engine's own view during a sweep level (quantrack.measure.scrape): Prometheus series per figure, the
    # first name present wins (kv_usage, running, waiting: gauges; preemptions, prefix_hits / prefix_queries,
    # prompt_cached / prompt_uncached: counters; prefix_hit_rate: a gauge); slots_path: busy slots, if served
    metrics_path: str = "/metrics"
    slots_path: str | None = None
    metric_series: ClassVar[dict[str, tuple[str, ...]]] = {}

    # -- wire format (pure; quantrack.engines.scoring) ------------------------------------------------
    def tokenize_request(self, text: str, add_special: bool = True,
                         model: str | None = None) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of this engine's /tokenize call (OpenAI-compatible servers: vLLM, SGLang)."""
        from quantrack.engines.scoring import openai_tokenize_request

        return openai_tokenize_request(text, add_special, model)

    def fixed_length_fields(self, max_tokens: int) -> dict[str, Any]:
        """Request fields that, with ``ignore_eos``, force exactly ``max_tokens`` of output (vLLM, SGLang:
        ``min_tokens``)."""
        return {"min_tokens": max_tokens}

    def score_prompt(self, post: Callable[[str, dict[str, Any]], Any], ids: Sequence[int], start: int,
                     k: int) -> list[dict[int, float]]:
        """Top-k log-probabilities at prompt positions ``start..len(ids)-1`` (each conditioned on the ids before
        it) through ``post(path, body) -> JSON``. ValueError when the answer is not what the engine sends."""
        raise NotImplementedError(f"{self.kind}: no prompt-logprob scoring")

    def side_server_spec(self, spec: LaunchSpec, util: float | None) -> LaunchSpec:
        """A second server of the same study beside a running one (the KL baseline): the same launch spec
        (TP, served name, context, study args) with one slot and ``util`` as its memory share."""
        from dataclasses import replace

        return replace(spec, util=util if self.gpu_memory_share else None, parallel=1)

    @abstractmethod
    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        """The exact command (a list; never run through a shell) that serves this arm."""

    def launch_env(self, spec: LaunchSpec) -> dict[str, str]:
        """Extra environment for the server process (arm env included)."""
        return {**spec.env, **spec.arm.env_dict}

    @abstractmethod
    def parse_log(self, lines: Iterable[str], source: str | None = None) -> LogReport:
        """Parse a startup log, streaming line by line."""

    def parse_log_file(self, path: str | Path) -> LogReport:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return self.parse_log(fh, source=str(path))

    @abstractmethod
    def query(self, base_url: str, timeout: float = 10.0) -> dict[str, Any]:
        """Live facts from a running server (version, model, KV capacity where exposed)."""
