"""Every name an arm run (and the study"s parent run) carries in MLflow: params, metrics, tags, artifacts.

One module, shared by the writer (``quantrack.run.record``) and the readers (``quantrack.report.compare``,
``quantrack.report.audit``): a name changes here or nowhere. docs/tracking.md documents each one.
Names built from a value (a sweep level, a latency statistic, a step) are functions below.
Nothing is imported here: readers import it without loading the runner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class RunStatus(StrEnum):
    """A logged run's status as the readers see it: MLflow's statuses, and REJECTED on the read side only (an
    arm the rulebook rejected is stored as KILLED with ``Tag.VERDICT`` = reject: MLflow has no such status)."""

    RUNNING = "RUNNING"
    SCHEDULED = "SCHEDULED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    REJECTED = "rejected"


class RuleVerdict(StrEnum):
    """A rulebook verdict (``Tag.VERDICT``, ``preflight/verdicts.json``)."""

    ALLOW = "allow"
    WARN = "warn"
    REJECT = "reject"


# (KV-cache scale sources, a closed set of their own, belong beside these.)


class FallbackState(StrEnum):
    """Values of ``Tag.FALLBACK``: UNKNOWN when the log could not say (never read as NO)."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


class ContentionState(StrEnum):
    """Values of ``Tag.CONTENTION`` (quantrack.measure.hygiene); UNKNOWN also when a run recorded none."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


# Status stored for an arm the rulebook rejected: it was never started (read back as RunStatus.REJECTED).
STATUS_REJECTED = "KILLED"
# An arm stopped by an interrupt or a signal: what it measured is logged, with the step it was in.
STATUS_KILLED = "KILLED"
STATUS_FAILED = "FAILED"
STATUS_FINISHED = "FINISHED"

# values of Tag.FALLBACK (FallbackState)
FALLBACK_YES = FallbackState.YES.value
FALLBACK_NO = FallbackState.NO.value
FALLBACK_UNKNOWN = FallbackState.UNKNOWN.value
# the steps whose measurement hygiene is tagged (Tag.CONTENTION)
HYGIENE_STEPS = ("latency", "sweep")


class Param:
    """Run params: what was run, where (strings)."""

    ARM = "arm"
    ARMS = "arms"
    BASELINE = "baseline"
    COMPUTE_CAPABILITY = "compute_capability"
    CUDA = "cuda"
    CUDA_DRIVER = "cuda_driver"
    DRIVER = "driver"
    DTYPE = "dtype"
    DTYPE_EFFECTIVE = "dtype_effective"
    ENGINE = "engine"
    ENGINE_ARGS = "engine_args"
    ENGINE_VERSION = "engine_version"
    EVAL_MAX_TOKENS = "eval_max_tokens"
    EVAL_NUM_QUESTIONS = "eval_num_questions"
    EVAL_NUM_SHOTS = "eval_num_shots"
    EVAL_SEED = "eval_seed"
    EVAL_STYLE = "eval_style"
    EVAL_TASK = "eval_task"
    GPU_CATALOG = "gpu_catalog"
    GPU_NAME = "gpu_name"
    GPU_UTIL = "gpu_util"
    HOSTNAME = "hostname"
    INPUT_TOKENS = "input_tokens"
    KL_BASELINE = "kl_baseline"
    KL_TOKENS = "kl_tokens"
    KL_TOP_K = "kl_top_k"
    KL_METHOD = "kl_method"  # quantrack.accuracy.kl.KLMethod: teacher-forced | decode-greedy
    KV_CACHE_DTYPE = "kv_cache_dtype"
    KV_CACHE_DTYPE_EFFECTIVE = "kv_cache_dtype_effective"
    LATENCY_ENDPOINT = "latency_endpoint"
    LATENCY_ITERATIONS = "latency_iterations"
    LATENCY_WARMUP = "latency_warmup"
    MAX_MODEL_LEN = "max_model_len"
    MIG = "mig"
    MODEL = "model"
    MODEL_NAME = "model_name"
    MODEL_REF = "model_ref"
    MODEL_REVISION = "model_revision"
    OUTPUT_TOKENS = "output_tokens"
    PARALLEL = "parallel"
    QUANTIZATION = "quantization"
    STUDY = "study"
    SWEEP_CONCURRENCY = "sweep_concurrency"
    SWEEP_RATES = "sweep_rates"  # open-loop request rates (requests/s)
    SWEEP_ARRIVAL = "sweep_arrival"  # poisson | constant, with SWEEP_SEED and SWEEP_MAX_CONCURRENCY
    SWEEP_SEED = "sweep_seed"
    SWEEP_MAX_CONCURRENCY = "sweep_max_concurrency"
    SWEEP_GOODPUT_SLO = "sweep_goodput_slo"  # per-request SLOs in ms (ttft:500,tpot:50)
    SWEEP_REPEATS = "sweep_repeats"
    SWEEP_DATASET = "sweep_dataset"  # random | gsm8k
    SWEEP_RANGE_RATIO = "sweep_range_ratio"
    SWEEP_SLO_SEARCH_PROBE = "sweep_slo_search_probe"  # the probe search asked: "rate 0.5:64, tolerance 0.1, x2"
    TP = "tp"
    WEIGHTS = "weights"
    # a Ray fleet's runs (quantrack.fleet.ray_runner)
    RAY_NODE_ID = "ray_node_id"
    GPU_SOURCE = "gpu_source"
    FLEET_GPU = "fleet_gpu"
    FLEET_GPUS = "fleet_gpus"
    FLEET_ATTEMPT = "fleet_attempt"
    FLEET_NODES_TRIED = "fleet_nodes_tried"


class Metric:
    """Metrics (floats). Measured unless listed in ``DERIVED_METRICS``."""

    KV_MIB_REPORTED = "kv_mib_reported"  # llama.cpp: the KV buffer its log prints (K + V)
    KV_MIB_PREDICTED = "kv_mib_predicted"
    KV_MIB_ERROR_PCT = "kv_mib_error_pct"
    KV_CELLS_PER_STREAM = "kv_cells_per_stream"
    KV_STREAMS = "kv_streams"
    # KL fidelity (quantrack.accuracy.kl.KLResult.metrics)
    KL_TOP1_AGREE = "kl_top1_agree"
    KL_MEAN = "kl_mean"
    KL_MEDIAN = "kl_median"
    KL_P99 = "kl_p99"
    KL_POSITIONS = "kl_positions"
    AVAILABLE_KV_GIB = "available_kv_gib"
    CAPACITY_ERROR_PCT = "capacity_error_pct"
    CUDA_GRAPH_GIB = "cuda_graph_gib"
    DECODE_TOK_S_P50 = "decode_tok_s_p50"
    E2E_MS_P50 = "e2e_ms_p50"
    GSM8K_ACCURACY = "gsm8k_accuracy"
    GSM8K_CI_HIGH = "gsm8k_ci_high"
    GSM8K_CI_LOW = "gsm8k_ci_low"
    GSM8K_CORRECT = "gsm8k_correct"
    GSM8K_DELTA_VS_BASELINE = "gsm8k_delta_vs_baseline"
    GSM8K_ERRORS = "gsm8k_errors"
    GSM8K_INVALID = "gsm8k_invalid"
    GSM8K_N = "gsm8k_n"
    GSM8K_SE = "gsm8k_se"
    # the budget verdict vs the baseline (quantrack.accuracy.budget; [eval] budget): interval in points
    BUDGET_PP = "budget_pp"
    BUDGET_LOW_PP = "budget_low_pp"
    BUDGET_HIGH_PP = "budget_high_pp"
    BUDGET_QUESTIONS_USED = "budget_questions_used"
    BUDGET_MORE_QUESTIONS = "budget_more_questions"
    KV_TOKENS_PREDICTED = "kv_tokens_predicted"
    KV_TOKENS_REPORTED = "kv_tokens_reported"
    LATENCY_N_FAILED = "latency_n_failed"
    LATENCY_N_OK = "latency_n_ok"
    MAX_CONCURRENCY = "max_concurrency"
    SAMPLE_TPOT_MS = "sample_tpot_ms"
    SAMPLE_TTFT_MS = "sample_ttft_ms"
    SERVER_TPOT_MS = "server_tpot_ms"
    TPOT_MS_P50 = "tpot_ms_p50"
    TPOT_CV = "tpot_cv"  # coefficient of variation of per-request TPOT (repeatability; measured)
    TPOT_VS_SERVER_PCT = "tpot_vs_server_pct"
    TTFT_MS_P50 = "ttft_ms_p50"
    WEIGHTS_GIB = "weights_gib"


class Tag:
    """Tags (strings), all under ``quantrack.``."""

    ARM = "quantrack.arm"
    ATTENTION_BACKEND = "quantrack.attention_backend"
    BASELINE = "quantrack.baseline"
    CONTENTION = "quantrack.{step}_contention"  # .format(step=...): yes / no / unknown (measure.hygiene)
    CONTENTION_REASONS = "quantrack.{step}_contention_reasons"
    FALLBACK_REASON = "quantrack.fallback_reason"  # why the fallback is "unknown"
    DERIVED_METRICS = "quantrack.derived_metrics"
    EFFECTIVE_KERNEL = "quantrack.effective_kernel"
    ERROR = "quantrack.error"
    FAILED_STEP = "quantrack.failed_step"
    FALLBACK = "quantrack.fallback"
    FALLBACK_EVIDENCE = "quantrack.fallback_evidence"
    FALLBACK_KINDS = "quantrack.fallback_kinds"
    GSM8K_CORRECT = "quantrack.gsm8k_correct"  # continued in .1, .2 ... past 8,000 positions (MLflow's tag limit)
    BUDGET_VERDICT = "quantrack.budget_verdict"  # within / exceeds / undecided
    BUDGET_METHOD = "quantrack.budget_method"  # sequential / fixed-n
    BUDGET_BASELINE = "quantrack.budget_baseline"  # the baseline run's arm the verdict pairs with
    EVAL_TASK = "quantrack.eval_task"
    EVAL_METRICS = "quantrack.eval_metrics"  # the prefix of the run's accuracy metrics (gsm8k, or the task's name)
    EVAL_ORDER = "quantrack.eval_order"
    GSM8K_DATA_SHA256 = "quantrack.gsm8k_data_sha256"
    GSM8K_SOURCE = "quantrack.gsm8k_source"
    LOG_NOT_FOUND = "quantrack.log_not_found"
    # KV-cache scales (quantrack.engines.kvplan.ScaleSource values): what preflight planned from the checkpoint and arm,
    # and what the engine's own lines showed (quantrack.engines.kvscale), with the deciding line
    KV_SCALE_PLANNED = "quantrack.kv_scale_planned"
    KV_SCALE_RULE = "quantrack.kv_scale_rule"
    KV_SCALE_SOURCE = "quantrack.kv_scale_source"
    KV_SCALE_EVIDENCE = "quantrack.kv_scale_evidence"
    LOG_QUANTIZATION = "quantrack.log_quantization"
    ROLE = "quantrack.role"
    RULE_IDS = "quantrack.rule_ids"
    SOURCE = "quantrack.source"
    STUDY = "quantrack.study"
    QUICK = "quantrack.quick"  # "true": run --quick (fewer requests; a first look)
    VERDICT = "quantrack.verdict"
    SLO_SEARCH = "quantrack.sweep_slo_search"  # the criterion the sweep bisected for (tpot_p95<=50ms)
    SLO_SEARCH_MODE = "quantrack.sweep_slo_search_mode"  # concurrency | rate
    SLO_SEARCH_FIRST_MISS = "quantrack.sweep_slo_search_first_miss"  # lowest measured level missing it; "none"
    SLO_SEARCH_METHOD = "quantrack.sweep_slo_search_method"  # probe (absent: bisection between measured levels)
    SLO_SEARCH_STOP = "quantrack.sweep_slo_search_stop"  # probe search: tolerance | top_of_range | never_met | ...
    # why the prefix-cache hit rate of the sweep's highest level is unknown (absent when it was measured)
    SWEEP_PREFIX_UNKNOWN = "quantrack.sweep_prefix_cache_unknown"
    SWEEP_DATASET = "quantrack.sweep_dataset"  # the workload the sweep sent (random, shared-prefix, ...)
    # the store's own bookkeeping (quantrack.store.tracking): idempotent upload, spool, parent link, provenance
    RUN_UUID = "quantrack.run_uuid"
    COMPLETE = "quantrack.complete"
    PARENT_UUID = "quantrack.parent_uuid"
    SPOOLED = "quantrack.spooled"
    VERSION = "quantrack.version"
    GIT_REVISION = "quantrack.git_revision"  # <sha>, <sha>-dirty (any tracked file of the repository differs), unknown
    CUDA_RUNTIME = "quantrack.cuda_runtime"  # the CUDA runtime torch uses (package metadata; nothing imported)
    TORCH_VERSION = "quantrack.torch_version"  # the installed torch's version (package metadata; torch never imported)
    MODEL_SHA256 = "quantrack.model_sha256"  # SHA-256 of the weights loaded (a file; a folder's manifest of its files)
    MODEL_SOURCE_SHA256 = "quantrack.model_source_sha256"  # the model they were made from (pinned file, or themselves)
    MODEL_SHA256_UNKNOWN = "quantrack.model_sha256_unknown"  # why the weights were not hashed
    STUDY_SHA256 = "quantrack.study_sha256"  # SHA-256 of the study file as run (its bytes when the run started)
    HOSTNAME = "quantrack.hostname"
    # the writing process's identity (quantrack.store.liveness): `sync --stale` ends a RUNNING run whose process is gone
    BOOT_ID = "quantrack.boot_id"  # the kernel's boot id (Linux /proc/sys/kernel/random/boot_id)
    PID_NAMESPACE = "quantrack.pid_namespace"  # /proc/self/ns/pid ("none" where there is none)
    PID = "quantrack.pid"
    PID_START = "quantrack.pid_start"  # the process's start time, seconds since the epoch (a reused pid differs)
    ENDED_BY = "quantrack.ended_by"  # who ended a run quantrack did not end itself, and why (sync --stale)
    FACT = "quantrack.fact"  # a node-fact run's kind ("probe"): see NodeFact
    FLEET = "quantrack.fleet"  # "ray": the run belongs to a fleet study
    FLEET_JOB = "quantrack.fleet.job"
    FLEET_ATTEMPT_ID = "quantrack.fleet.attempt_id"
    # MLflow's own tags that quantrack reads
    MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"
    MLFLOW_RUN_NAME = "mlflow.runName"


class Role:
    """Values of ``Tag.ROLE``."""

    STUDY = "study"
    ARM = "arm"
    NODE_FACT = "node-fact"


class NodeFact:
    """Names of a node-fact run (``quantrack probe --track``, experiment ``EXPERIMENT``)."""

    EXPERIMENT = "quantrack-node-facts"
    KIND_PROBE = "probe"  # value of Tag.FACT
    PARAM_HOSTNAME = "node_hostname"
    PARAM_GPU_NAME = Param.GPU_NAME
    PARAM_COMPUTE_CAPABILITY = Param.COMPUTE_CAPABILITY
    PARAM_TORCH = "torch"
    PARAM_TORCH_CUDA = "torch_cuda"
    PARAM_MODEL = Param.MODEL
    TAG_PROBE_VERDICT = "probe.verdict"  # native | none
    METRIC_COPY_TBPS = "probe_copy_tbps"
    FP8_SPEEDUP = re.compile(r"^probe_fp8_speedup_b(\d+)$")  # the reader's side of probe_fp8_speedup()


def probe_fp8_speedup(batch: int) -> str:
    return f"probe_fp8_speedup_b{batch}"


def probe_bf16_stack_ms(batch: int) -> str:
    return f"probe_bf16_stack_ms_b{batch}"


def probe_fp8_stack_ms(batch: int) -> str:
    return f"probe_fp8_stack_ms_b{batch}"


class Artifact:
    """Artifact paths inside a run."""

    EVAL_RECORDS = "eval/records.jsonl"
    EVAL_RESULT = "eval/result.json"
    KL_RESULT = "kl/result.json"
    LATENCY_LATENCY = "latency/latency.json"
    LAUNCH_COMMAND = "launch/command.txt"
    LAUNCH_ENV = "launch/env.json"
    PREFLIGHT_VERDICTS = "preflight/verdicts.json"
    PROVENANCE_WEIGHTS = "provenance/weights.json"  # every weight file loaded: path, bytes, SHA-256
    SERVER_LIVE = "server/live.json"
    SERVER_LOG_REPORT = "server/log_report.json"
    STUDY_STUDY = "study/study.toml"
    SWEEP_SWEEP = "sweep/sweep.json"
    HYGIENE = "hygiene/{step}.json"  # .format(step=...): what quantrack.measure.hygiene sampled during the step


# --- names built from a value ----------------------------------------------------------------------------

def sweep_output_tps(c: int) -> str:
    """Measured output tokens/s at sweep concurrency ``c``."""
    return f"sweep_output_tps_c{c}"


def sweep_tpot_p50(c: int) -> str:
    return f"sweep_tpot_ms_p50_c{c}"


def sweep_ttft_p50(c: int) -> str:
    return f"sweep_ttft_ms_p50_c{c}"


def sweep_request_tps(c: int) -> str:
    return f"sweep_request_tps_c{c}"


def sweep_level(figure: str, level: str) -> str:
    """A sweep figure at one level: ``level`` is ``c16`` (concurrency) or ``r2.5`` (requests/s), e.g.
    ``sweep_tpot_ms_p95_c16``, ``sweep_goodput_rps_r2``, ``sweep_engine_kv_usage_max_c64``."""
    return f"sweep_{figure}_{level}"


SWEEP_SLO_LIMIT = "sweep_slo_limit"  # highest measured level meeting [sweep] slo_search (c or requests/s)
SWEEP_LEVEL = re.compile(r"^sweep_(.+)_([cr][0-9.e+-]+)$")  # the reader's side of sweep_level()
SWEEP_OUTPUT_TPS = re.compile(r"^sweep_output_tps_c(\d+)$")  # the reader's side of sweep_output_tps()
SWEEP_TPOT_P50 = re.compile(r"^sweep_tpot_ms_p50_c(\d+)$")
SWEEP_TTFT_P50 = re.compile(r"^sweep_ttft_ms_p50_c(\d+)$")


def latency_stat(figure: str, stat: str) -> str:
    """``ttft_ms`` / ``tpot_ms`` / ``itl_ms`` / ``e2e_ms`` / ``server_tpot_ms`` x ``p50|mean|p90|p99|ci_low|ci_high``."""
    return f"{figure}_{stat}"


def step_seconds(step: str) -> str:
    """Wall seconds a completed step took (measured)."""
    return f"step_{step}_s"


def server_log(name: str) -> str:
    """The engine"s own log, stored under ``server/``."""
    return f"server/{name}"


def plot(name: str) -> str:
    return f"plots/{name}"


DERIVED_METRICS = (Metric.KV_TOKENS_PREDICTED, Metric.CAPACITY_ERROR_PCT, Metric.KV_MIB_PREDICTED, Metric.KV_MIB_ERROR_PCT,
                   Metric.TPOT_VS_SERVER_PCT, Metric.GSM8K_DELTA_VS_BASELINE)


# per level: (metric figure, where in the row); every one measured (engine_*: by the engine, scraped)
LEVEL_FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tpot_ms_p95", ("tpot_ms", "p95")), ("ttft_ms_p95", ("ttft_ms", "p95")), ("e2e_ms_p95", ("e2e_ms", "p95")),
    ("tpot_ms_p99", ("tpot_ms", "p99")), ("ttft_ms_p99", ("ttft_ms", "p99")),
    ("goodput_rps", ("goodput", "request_s")), ("goodput_tps", ("goodput", "output_tok_s")),
    ("goodput_fraction", ("goodput", "fraction")),
    ("output_tps_ci_low", ("repeat_stats", "output_tok_s", "ci95_low")),
    ("output_tps_ci_high", ("repeat_stats", "output_tok_s", "ci95_high")),
    ("engine_kv_usage_max", ("server_metrics", "kv_usage_max")),
    ("engine_running_max", ("server_metrics", "running_max")),
    ("engine_waiting_max", ("server_metrics", "waiting_max")),
    ("engine_preemptions", ("server_metrics", "preemptions")),
    ("engine_prefix_hit_rate", ("prefix_cache_hit_rate",)),  # engine /metrics, else its per-request counts
    ("engine_busy_slots_max", ("server_metrics", "busy_slots_max")),
)


# --- accuracy figures, named after the task ---------------------------------------------------------------------

GSM8K_PREFIX = "gsm8k"  # every GSM8K pool (gsm8k, gsm8k-train, gsm8k-all) logs under gsm8k_*
# prefixes a task's metrics may not take: they name other figures of a run
_RESERVED_PREFIXES = ("gsm8k", "kl", "sweep", "latency", "step", "budget", "kv", "tpot", "ttft", "e2e", "weights",
                      "capacity", "server", "engine", "decode", "prefill", "available", "cuda")


def task_prefix(task: str | None) -> str:
    """The prefix of a run's accuracy metrics: ``gsm8k`` for the GSM8K pools, else the task's name made a metric
    name (``support-bot.jsonl`` -> ``support_bot``; ``humaneval``), ``task_``-prefixed where it would clash."""
    if not task:
        return GSM8K_PREFIX
    from quantrack.accuracy.gsm8k import TASKS

    if task in TASKS:
        return GSM8K_PREFIX
    stem = task.rsplit("/", 1)[-1].removesuffix(".jsonl")
    slug = "".join(c if c.isalnum() else "_" for c in stem.lower()).strip("_") or "task"
    if slug[0].isdigit() or slug.split("_")[0] in _RESERVED_PREFIXES:
        slug = f"task_{slug}"
    return slug


@dataclass(frozen=True)
class AccuracyNames:
    """The metric and tag names of one task's accuracy figures (for GSM8K: ``Metric.GSM8K_*``, ``Tag.GSM8K_*``)."""

    prefix: str
    accuracy: str
    se: str
    ci_low: str
    ci_high: str
    n: str
    correct: str
    invalid: str
    errors: str
    delta_vs_baseline: str
    outcomes_tag: str
    data_sha256_tag: str
    source_tag: str
    label: str  # the column header's name for the task


_ACCURACY_FIGURES = ("accuracy", "se", "ci_low", "ci_high", "n", "correct", "invalid", "errors", "delta_vs_baseline")


def accuracy_names(prefix: str | None = None) -> AccuracyNames:
    p = prefix or GSM8K_PREFIX
    return AccuracyNames(prefix=p, **{what: f"{p}_{what}" for what in _ACCURACY_FIGURES},
                         outcomes_tag=f"quantrack.{p}_correct",
                         data_sha256_tag=f"quantrack.{p}_data_sha256", source_tag=f"quantrack.{p}_source",
                         label="GSM8K" if p == GSM8K_PREFIX else p)
