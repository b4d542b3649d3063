"""The one interface every engine adapter implements (vLLM, SGLang, llama.cpp).

Adapters own everything engine-specific: flag spellings, the launch argv, the startup-log
format and the live endpoints. The rest of quantrack talks to engines only through this.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from quantrack.arms import Arm

if TYPE_CHECKING:
    from quantrack.engines.kvplan import KVScaleRequest, ScalePlan
    from quantrack.engines.kvscale import KVScaleObservation
    from quantrack.hardware.catalog import ModelShape

_GIB = 2**30
# a log-parsing rule (quantrack.engines.logparse.RuleSpec, typed exactly there): (keyword, handler[, done])
RuleSpec = tuple[str, Callable[..., None]] | tuple[str, Callable[..., None], Callable[..., bool]]


class FileSource:
    """A log file to scan in blocks (much faster than line by line for big logs; quantrack.engines.logparse)."""

    def __init__(self, path: str) -> None:
        self.path = path


# the package's parse_log_file (quantrack.engines), set when the package is imported: the one parse entry point
parse_captured_log: Callable[..., LogReport] | None = None


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
    kv_scales: dict[str, Any] | None = None  # KVScaleObservation.to_dict() (EngineAdapter.observe_kv_scales)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def fell_back(self) -> bool:
        return bool(self.fallbacks)


# --- what a capacity prediction takes and gives (quantrack.capacity does the arithmetic) -------------------
@dataclass(frozen=True)
class CapacitySettings:
    """The engine settings one capacity prediction assumes (None: the engine's own default); each adapter's
    ``predict_capacity`` reads the ones its engine has."""

    util: float | None = None
    context_len: int | None = None
    max_num_batched_tokens: int | None = None
    tp: int = 1
    max_num_seqs: int | None = None
    gpu_name: str | None = None
    block_size: int = 16
    page_size: int = 1
    n_parallel: int = 1
    kv_unified: bool = False
    reserve_bytes: float | None = None
    kv_cache_memory_bytes: float | None = None


@dataclass
class EnginePrediction:
    """What one engine is predicted to log for one arm (derived)."""

    engine: str
    arm: str
    kv_dtype: str
    naive_tokens: int
    engine_tokens: int
    weights_bytes: float  # per rank, as the engine holds them
    kv_bytes: float  # per rank, the KV pool the engine allocates
    kv_bytes_per_token: float  # per rank
    reserved: dict[str, float] = field(default_factory=dict)  # bytes per component (per rank)
    settings: dict[str, Any] = field(default_factory=dict)  # the engine settings the prediction assumed
    assumptions: list[str] = field(default_factory=list)
    context_len: int | None = None

    @property
    def max_concurrency(self) -> float | None:
        return None if not self.context_len else self.engine_tokens / self.context_len

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["weights_gib"] = round(self.weights_bytes / _GIB, 4)
        d["kv_gib"] = round(self.kv_bytes / _GIB, 4)
        d["reserved_gib"] = {k: round(v / _GIB, 4) for k, v in self.reserved.items()}
        d["max_concurrency"] = None if self.max_concurrency is None else round(self.max_concurrency, 2)
        d["basis"] = "derived"
        return d


@dataclass
class LiveFacts:
    """What a running server says about itself (``EngineAdapter.query``, measured): the engine, where, and what
    its info endpoints answered, as read. ``facts`` keeps each engine's own keys (vLLM's ``kv_cache_size_tokens``,
    SGLang's ``max_total_num_tokens``, llama.cpp's ``slots`` ...); the two every engine may give are properties."""

    engine: str
    base_url: str
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def engine_version(self) -> str | None:
        v = self.facts.get("engine_version")
        return None if v is None else str(v)

    @property
    def model(self) -> str | None:
        v = self.facts.get("model")
        return None if v is None else str(v)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "base_url": self.base_url, **self.facts}


@dataclass(frozen=True)
class Marker:
    """A line that says "this engine wrote the log" (quantrack.engines.detect): a regular expression searched
    anywhere in a line, its weight, where it was seen (a format string repo@sha:path:Lnn or a public log in
    tests/data/public-logs/), and ``anchors``: literal strings one of which every match contains (the regex runs
    only on text that holds one, a C-speed substring test)."""

    engine: str
    label: str
    pattern: str
    weight: int
    source: str
    anchors: tuple[str, ...]


@dataclass(frozen=True)
class LinePrefix:
    """An engine's own line prefix (quantrack.engines.logparse.strip_prefix): ``pattern`` is anchored at the line's
    start and may name the groups ``level`` and ``rank`` (a process or rank tag); ``first`` lists the characters
    such a line can start with (the dispatch key); ``levels`` spells the level names out (llama.cpp's ``I``)."""

    first: str
    pattern: re.Pattern[str]
    levels: Mapping[str, str] | None = None


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


@dataclass(frozen=True)
class Serving:
    """How the engine is started and found ready."""

    default_port: int = 8000
    health_path: str = "/health"
    health_needs_status_ok: bool = False  # the health body must also say {"status": "ok"} (llama.cpp)
    local_file: bool = False  # the model is one local file that must exist (a GGUF)
    refuses_context_over_max: bool = True  # refuses a context above the model's maximum (llama.cpp runs it)


@dataclass(frozen=True)
class MemoryModel:
    """How the engine takes device memory: a share of each GPU, sized by a profile (vLLM, SGLang), or what its
    context needs, allocated at start (llama.cpp)."""

    gpu_share: bool = True  # takes a fraction of GPU memory (vLLM/SGLang); llama.cpp allocates what it needs
    default_share: float | None = None  # the engine's own default memory share, where it has one
    # refuses to start unless free memory >= its share of the total: two servers on one GPU need shares adding to <= 1
    start_checks_share: bool = False
    profile_settings: bool = False  # max_num_batched_tokens / max_num_seqs shape its memory profile run
    slots: bool = False  # one process whose KV cache is split into parallel slots (llama.cpp -np): no TP ranks
    full_context_kv: bool = False  # allocates the KV cache of the whole context at start (llama.cpp)


@dataclass(frozen=True)
class Install:
    """What a node installs for the engine, and what the rules compare."""

    pip_requirement: str | None = None  # the engine's own pip package, pinned per study ([engine] version)
    quantrack_extra: str = ""  # the quantrack extra a node installs for this engine ("[cpu]": xllamacpp)
    needs_gpu: bool = True  # a fleet job reserves the study's GPUs for it (llama.cpp studies run on CPU nodes)
    cuda_gated: bool = False  # rules gate on the CUDA its wheels were built with (--cuda)
    release_versions: bool = True  # has release versions the rules compare (llama.cpp builds are numbered)


class EngineAdapter(ABC):
    """One per engine, registered by ``kind`` in ``quantrack.engines``. Callers read its facts and call its
    methods; none branches on ``kind``."""

    kind: str = ""
    label: str = ""  # how the engine is named to a user: "vLLM", "SGLang", "llama.cpp"
    serving: Serving = Serving()
    memory: MemoryModel = MemoryModel()
    install: Install = Install()
    server_timing: str | None = None  # where a server-side per-token time comes from, if the engine reports one
    # LogReport fields (or extra keys) printed only once the weights are on the device, where fallback lines
    # are printed (``loaded``)
    loaded_fields: tuple[str, ...] = ("weights_gib", "kv_cache_tokens")

    # its [engine.KIND] table of rules/methods.toml (flags, KV spellings, methods) when that file has none: an
    # engine registered at run time (a plugin, the test engine) carries its own; the built-in ones are in the file
    methods: Mapping[str, Any] | None = None

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
        it) through ``post(path, body) -> JSON``. ValueError when the answer is not what the engine sends; BadInput
        for an engine whose adapter has none (the teacher-forced KL; ``run_kl`` asks ``kl_unsupported`` first)."""
        from quantrack.errors import BadInput

        raise BadInput(self.kl_unsupported(decode=False) or f"{self.kind}: no prompt-logprob scoring")

    def next_token_request(self, prefix: Sequence[int], k: int) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) asking for ONE greedy token after ``prefix`` with its top-k log-probabilities: the
        decode-side KL method (quantrack.accuracy.kl KLMethod.DECODE_GREEDY). Called with a prefix that grows by one
        token per step, an engine with prefix caching reads every earlier position's K/V from its cache -- the
        quantized cache a candidate arm generates from -- and computes only the newest token, as decoding does.
        BadInput for an engine whose adapter has none (``run_kl`` asks ``kl_unsupported`` first)."""
        from quantrack.errors import BadInput

        raise BadInput(self.kl_unsupported(decode=True) or f"{self.kind}: no next-token request")

    def parse_next_token(self, resp: Any, k: int) -> tuple[dict[int, float], bool]:
        """(top-k of the one generated token, whether the engine stopped there: end of sequence) from the answer to
        ``next_token_request``. ValueError when the answer is not what the engine sends."""
        raise ValueError(f"{self.label or self.kind}: no next-token answer to parse")

    def kl_unsupported(self, *, decode: bool) -> str | None:
        """Why this engine gives no decode-side (``decode``) or teacher-forced KL -- its adapter leaves the request
        to this interface -- or None when it gives it (one line, for BadInput before any server is asked)."""
        member, method = ("next_token_request", "decode-side") if decode else ("score_prompt", "teacher-forced")
        if getattr(type(self), member) is getattr(EngineAdapter, member):
            return f"{self.label or self.kind}: no {method} KL (its adapter has no {member})"
        return None

    def side_server_spec(self, spec: LaunchSpec, util: float | None) -> LaunchSpec:
        """A second server of the same study beside a running one (the KL baseline): the same launch spec
        (TP, served name, context, study args) with one slot and ``util`` as its memory share."""
        from dataclasses import replace

        return replace(spec, util=util if self.memory.gpu_share else None, parallel=1)

    @abstractmethod
    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        """The exact command (a list; never run through a shell) that serves this arm."""

    def launch_env(self, spec: LaunchSpec) -> dict[str, str]:
        """Extra environment for the server process (arm env included)."""
        return {**spec.env, **spec.arm.env_dict}

    # -- startup log (quantrack.engines.logparse, .detect) ----------------------------------------------
    markers: tuple[Marker, ...] = ()  # lines that say this engine wrote a log, with their weights
    line_prefixes: tuple[LinePrefix, ...] = ()  # this engine's own line prefixes, stripped before matching
    # fallback and degraded-mode rules, also looked for in every other engine's log (one scan finds them all)
    fallback_rules: Sequence[RuleSpec] = ()

    @abstractmethod
    def parse_log(self, lines: Iterable[str] | Iterable[bytes] | str | bytes | FileSource,
                  source: str | None = None, extra_rules: Sequence[RuleSpec] = ()) -> LogReport:
        """Parse a startup log, streaming (text, lines, or a logparse.FileSource scanned in blocks);
        ``extra_rules`` run in the same pass (the other engines' fallback catalogues)."""

    def parse_log_file(self, path: str | Path) -> LogReport:
        """A log the runner captured, streamed from disk; every engine's fallback catalogue is looked for too
        (quantrack.engines.parse_log_file with this engine given; an empty or binary file gives not-found fields)."""
        assert parse_captured_log is not None, "quantrack.engines sets it on import"
        return parse_captured_log(path, self.kind, strict=False)

    def loaded(self, report: LogReport) -> bool:
        """The log got as far as loading the weights, where fallback lines are printed: a log without any of
        ``loaded_fields`` cannot rule a fallback out (the run's ``fallback`` and ``quantrack audit``)."""
        return any((getattr(report, f) if hasattr(report, f) else report.extra.get(f)) is not None
                   for f in self.loaded_fields)

    def serve_arm(self, spec: str) -> Arm:
        """The arm ``quantrack serve --arm SPEC`` names (quantrack.arms.parse_arm_spec)."""
        from quantrack.arms import parse_arm_spec

        return parse_arm_spec(spec)

    # -- KV-cache scales (quantrack.engines.kvplan before launch, quantrack.engines.kvscale from the log) -----------
    kv_scale_rules_version: str | None = None  # the engine version whose code its KV-scale rules were read from

    def plan_kv_scales(self, req: KVScaleRequest) -> ScalePlan | None:
        """Which k/v scales this engine will use for the arm's KV cache, by a rule of ``rules/kv-scales.toml``
        (``req.plan(rule_id)``) or ``unknown`` and why (``req.unknown``); None: quantrack has no KV-scale rules
        for this engine (quantrack.engines.plan_scales attaches the measurements)."""
        return None

    def observe_kv_scales(self, report: LogReport, lines: dict[str, tuple[int, str]]) -> KVScaleObservation | None:
        """Which k/v scales the engine used, from the KV-scale lines its log's pass collected (``lines``: kind ->
        (line number, line); quantrack.engines.kvscale.observe_lines reads them) and the report; None: its log is
        not read for KV scales."""
        return None

    # -- capacity (quantrack.hardware.capacity: the arithmetic; the adapter picks its engine's reservation model) ------
    def predict_capacity(self, shape: ModelShape, gpu_memory_bytes: float, arm: Arm, kv: str,
                         settings: CapacitySettings) -> EnginePrediction:
        """The KV capacity this engine is predicted to log for one arm (derived); ``kv`` is the arm's KV dtype
        for this model, ``settings`` the engine settings given (None: the engine's defaults)."""
        from quantrack.errors import BadInput

        raise BadInput(f"{self.label or self.kind}: no capacity model")

    def establish_arm(self, report: LogReport) -> tuple[Arm | None, str]:
        """The arm (weights x KV dtype) this engine's log establishes, or None and why not."""
        return None, f"the arm is not read from a {self.label or self.kind} log"

    @abstractmethod
    def query(self, base_url: str, timeout: float = 10.0) -> LiveFacts:
        """Live facts from a running server (version, model, KV capacity where exposed)."""
