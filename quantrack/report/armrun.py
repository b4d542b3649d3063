"""The read model of a logged arm run: one typed object per run, built once from the store's string-keyed
params, metrics and tags (``tracking.RunRow``), using only ``quantrack.run.schema``'s names.

``report/compare.py``, ``report/decision.py`` and ``report/audit.py`` read runs only through ``ArmRun``: the status
(REJECTED derived once from KILLED + the rulebook's reject verdict), the configuration, the sweep levels, accuracy
and the per-question outcomes, KL, the fallback, the measurement-hygiene flags and the cost inputs. Which run stands
for an arm, the baseline and the arm order are decided here too (``ArmSet``), once for every reader.

Pure and cheap: no mlflow, no pricing, nothing from the runner.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quantrack.errors import BadInput, did_you_mean
from quantrack.run.schema import (
    HYGIENE_STEPS,
    SWEEP_OUTPUT_TPS,
    SWEEP_TPOT_P50,
    SWEEP_TTFT_P50,
    ContentionState,
    FallbackState,
    Metric,
    NodeFact,
    Param,
    RuleVerdict,
    RunStatus,
    Tag,
    accuracy_names,
)

if TYPE_CHECKING:
    from quantrack.store.records import RunRow

DEFAULT_BASELINE = "bf16"  # the arm taken as the baseline when none is named or tagged
OUTCOME_SYMBOLS = frozenset("01.")  # Tag.GSM8K_CORRECT: '1' right, '0' wrong, '.' not answered


def run_status(status: str, verdict: str | None) -> RunStatus:
    """The read-side status: REJECTED for a KILLED run the rulebook rejected (never served)."""
    if verdict == RuleVerdict.REJECT:
        return RunStatus.REJECTED
    try:
        return RunStatus(status)
    except ValueError:  # a status this quantrack does not know: kept as RUNNING would lie; FAILED is safe
        return RunStatus.FAILED


@dataclass(frozen=True)
class Configuration:
    """What was run, as logged (params)."""

    weights: str | None
    kv_cache_dtype: str | None  # requested
    kv_cache_dtype_effective: str | None
    quantization: str | None
    engine: str | None
    engine_version: str | None
    gpu_name: str | None  # NVML's name (or the fleet job's GPU type)
    gpu_catalog: str | None  # the study's catalog GPU
    tp: str | None
    hostname: str | None
    compute_capability: str | None
    mig: str | None
    model_sha256: str | None = None  # the weights loaded (quantrack.models.weights); None: not recorded
    model_source_sha256: str | None = None  # the model they were made from

    @property
    def kv_shown(self) -> str | None:
        return self.kv_cache_dtype_effective or self.kv_cache_dtype

    @property
    def gpu(self) -> str:
        """The GPU a run measured on: NVML's name, else the study's catalog GPU."""
        return self.gpu_name or self.gpu_catalog or "unknown GPU"

    @property
    def gpu_count(self) -> int:
        try:
            return max(1, int(self.tp or 1))
        except ValueError:
            return 1

    @property
    def priced_gpus(self) -> list[str]:
        """The GPU names a price may be looked up under, most specific first (cost inputs)."""
        return [g for g in (self.gpu_name, self.gpu_catalog) if g and g != "auto"]


@dataclass(frozen=True)
class SweepLevel:
    """The run metrics of one sweep concurrency (measured); the other statistics are in the sweep artifact."""

    output_tps: float | None = None
    tpot_p50_ms: float | None = None
    ttft_p50_ms: float | None = None


@dataclass(frozen=True)
class Accuracy:
    """The accuracy task as logged (measured or imported; GSM8K, or a task file's) and the per-question outcomes
    behind the paired test."""

    accuracy: float | None
    se: float | None
    n: float | None
    ci_low: float | None  # 95% Wilson interval
    ci_high: float | None
    source: str | None  # Tag.GSM8K_SOURCE ("measured", "imported: ...")
    outcomes: str | None  # '1' / '0' / '.' per question, None when not logged or malformed
    data_sha256: str | None
    task: str = "gsm8k"  # the metrics' prefix (run.schema.task_prefix): gsm8k, or the task file's name

    @property
    def imported(self) -> bool:
        return (self.source or "measured").startswith("imported")


@dataclass(frozen=True)
class Fallback:
    state: str | None  # Tag.FALLBACK as logged (a FallbackState value), None when the run has no tag
    kinds: str | None
    evidence: str | None
    reason: str | None  # why the state is unknown

    @property
    def fell_back(self) -> bool:
        return self.state == FallbackState.YES


@dataclass(frozen=True)
class Contention:
    """One step's measurement hygiene: state yes / no / unknown (unknown when the run recorded none)."""

    state: ContentionState | str
    reasons: str


@dataclass(frozen=True)
class ArmRun:
    """One logged arm run, typed. ``row`` is the run as read from the store (artifacts are read through it)."""

    row: RunRow
    arm: str
    run_id: str
    status: RunStatus
    stored_status: str  # MLflow's status as stored (KILLED for a rejected arm)
    start_time: int
    config: Configuration
    verdict: str | None  # the rulebook's worst verdict (RuleVerdict value) as tagged
    rule_ids: tuple[str, ...]
    baseline_tag: bool
    quick: bool
    weights_gib: float | None
    kv_tokens_reported: float | None
    kv_tokens_predicted: float | None
    capacity_error_pct: float | None
    kv_mib_reported: float | None
    tpot_ms_p50: float | None
    server_tpot_ms: float | None
    log_quantization: str | None  # the quantization the engine's log printed (llama.cpp: the GGUF file type)
    effective_kernel: str | None  # the linear kernel the log names
    accuracy: Accuracy
    kl_mean: float | None
    kl_top1_agree: float | None
    fallback: Fallback
    contention: dict[str, Contention]
    sweep: dict[int, SweepLevel]
    kl_method: str | None = None  # teacher-forced | decode-greedy (param kl_method; None: the run predates it)
    kv_scale_source: str | None = None  # the KV scales the engine's lines showed (quantrack.engines.kvscale)
    kv_scale_evidence: str | None = None
    kv_scale_planned: str | None = None  # what preflight planned (quantrack.engines.kvplan)
    kv_scale_rule: str | None = None

    @property
    def finished(self) -> bool:
        return self.status == RunStatus.FINISHED

    @property
    def output_tps(self) -> dict[int, float]:
        """Measured output tok/s per sweep concurrency (finite, positive figures only)."""
        return {c: lv.output_tps for c, lv in sorted(self.sweep.items())
                if lv.output_tps is not None and math.isfinite(lv.output_tps) and lv.output_tps > 0}

    def contention_of(self, step: str) -> Contention:
        return self.contention.get(step) or Contention(ContentionState.UNKNOWN, "")

    @property
    def metrics(self) -> dict[str, float]:
        """Every metric as logged (for the JSON views that list them by their MLflow names)."""
        return self.row.metrics


def _sweep_levels(metrics: dict[str, float]) -> dict[int, SweepLevel]:
    found: dict[int, dict[str, float]] = {}
    for key, value in metrics.items():
        for pat, attr in ((SWEEP_OUTPUT_TPS, "output_tps"), (SWEEP_TPOT_P50, "tpot_p50_ms"),
                          (SWEEP_TTFT_P50, "ttft_p50_ms")):
            m = pat.match(key)
            if m and isinstance(value, (int, float)):
                found.setdefault(int(m.group(1)), {})[attr] = float(value)
    return {c: SweepLevel(**v) for c, v in found.items()}


def _size_or_none(v: float | None) -> float | None:
    """A logged size, or None for a negative one (not a size; see quantrack.engines.sglang)."""
    return None if v is None or v < 0 else v


def arm_run(r: RunRow) -> ArmRun:
    """The read model of one run."""
    p, m, t = r.params, r.metrics, r.tags
    names = accuracy_names(t.get(Tag.EVAL_METRICS))  # gsm8k_* unless the run asked a task file (its name)
    outcomes = t.get(names.outcomes_tag)
    i = 1
    while outcomes is not None and f"{names.outcomes_tag}.{i}" in t:  # continued past MLflow's tag limit
        outcomes += t[f"{names.outcomes_tag}.{i}"]
        i += 1
    verdict = t.get(Tag.VERDICT)
    return ArmRun(
        row=r, arm=r.arm, run_id=r.run_id, status=run_status(r.status, verdict), stored_status=r.status,
        start_time=r.start_time,
        config=Configuration(
            weights=p.get(Param.WEIGHTS), kv_cache_dtype=p.get(Param.KV_CACHE_DTYPE),
            kv_cache_dtype_effective=p.get(Param.KV_CACHE_DTYPE_EFFECTIVE), quantization=p.get(Param.QUANTIZATION),
            engine=p.get(Param.ENGINE), engine_version=p.get(Param.ENGINE_VERSION), gpu_name=p.get(Param.GPU_NAME),
            gpu_catalog=p.get(Param.GPU_CATALOG), tp=p.get(Param.TP), hostname=p.get(Param.HOSTNAME),
            compute_capability=p.get(Param.COMPUTE_CAPABILITY), mig=p.get(Param.MIG),
            model_sha256=t.get(Tag.MODEL_SHA256), model_source_sha256=t.get(Tag.MODEL_SOURCE_SHA256)),
        verdict=verdict, rule_ids=tuple(i for i in (t.get(Tag.RULE_IDS) or "").split(",") if i),
        baseline_tag=t.get(Tag.BASELINE) == "true", quick=t.get(Tag.QUICK) == "true",
        # a negative size is not one: stores logged before SGLang's negative 'mem usage' was refused hold one
        weights_gib=_size_or_none(m.get(Metric.WEIGHTS_GIB)), kv_tokens_reported=m.get(Metric.KV_TOKENS_REPORTED),
        kv_tokens_predicted=m.get(Metric.KV_TOKENS_PREDICTED), capacity_error_pct=m.get(Metric.CAPACITY_ERROR_PCT),
        kv_mib_reported=m.get(Metric.KV_MIB_REPORTED), tpot_ms_p50=m.get(Metric.TPOT_MS_P50),
        server_tpot_ms=m.get(Metric.SERVER_TPOT_MS), log_quantization=t.get(Tag.LOG_QUANTIZATION),
        effective_kernel=t.get(Tag.EFFECTIVE_KERNEL),
        accuracy=Accuracy(
            accuracy=m.get(names.accuracy), se=m.get(names.se), n=m.get(names.n),
            ci_low=m.get(names.ci_low), ci_high=m.get(names.ci_high), source=t.get(names.source_tag),
            outcomes=outcomes if outcomes and set(outcomes) <= OUTCOME_SYMBOLS else None,
            data_sha256=t.get(names.data_sha256_tag), task=names.prefix),
        kl_mean=m.get(Metric.KL_MEAN), kl_top1_agree=m.get(Metric.KL_TOP1_AGREE),
        fallback=Fallback(state=t.get(Tag.FALLBACK), kinds=t.get(Tag.FALLBACK_KINDS),
                          evidence=t.get(Tag.FALLBACK_EVIDENCE), reason=t.get(Tag.FALLBACK_REASON)),
        contention={step: Contention(t.get(Tag.CONTENTION.format(step=step)) or ContentionState.UNKNOWN,
                                     t.get(Tag.CONTENTION_REASONS.format(step=step)) or "")
                    for step in HYGIENE_STEPS},
        sweep=_sweep_levels(m),
        kl_method=p.get(Param.KL_METHOD), kv_scale_source=t.get(Tag.KV_SCALE_SOURCE),
        kv_scale_evidence=t.get(Tag.KV_SCALE_EVIDENCE), kv_scale_planned=t.get(Tag.KV_SCALE_PLANNED),
        kv_scale_rule=t.get(Tag.KV_SCALE_RULE),
    )


def as_arm_runs(runs: Iterable[RunRow | ArmRun]) -> list[ArmRun]:
    """The read model of each run (runs already read are kept)."""
    return [r if isinstance(r, ArmRun) else arm_run(r) for r in runs]


# --- which run stands for each arm, the baseline, the order ----------------------------------------------------

@dataclass
class ArmSet:
    """An experiment's arms as every reader shows them: the run that stands for each arm (its newest FINISHED
    run, else its newest run of any status), the other runs of each arm (re-runs, retries' partial runs), the
    baseline and the order (the baseline first, then the order the arms were first run)."""

    chosen: dict[str, ArmRun]
    order: list[str]
    baseline: str | None
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)  # arm -> {stored status: runs not shown}

    @property
    def base(self) -> ArmRun | None:
        return self.chosen.get(self.baseline) if self.baseline else None

    def runs(self) -> list[ArmRun]:
        return [self.chosen[a] for a in self.order]


def pick_arm_runs(runs: list[ArmRun]) -> dict[str, ArmRun]:
    """Newest FINISHED run per arm; an arm with none keeps its newest run of any status."""
    best: dict[str, ArmRun] = {}
    for r in runs:
        cur = best.get(r.arm)
        if cur is None:
            best[r.arm] = r
            continue
        r_ok, cur_ok = r.stored_status == RunStatus.FINISHED, cur.stored_status == RunStatus.FINISHED
        if (r_ok, r.start_time) > (cur_ok, cur.start_time):
            best[r.arm] = r
    return best


def skipped_runs(runs: list[ArmRun], chosen: dict[str, ArmRun]) -> dict[str, dict[str, int]]:
    """Per arm, the stored statuses of its runs that the readers do not show."""
    out: dict[str, Counter[str]] = {}
    for r in runs:
        shown = chosen.get(r.arm)
        if shown is not None and r.run_id != shown.run_id:
            out.setdefault(r.arm, Counter())[r.stored_status] += 1
    return {a: dict(sorted(c.items())) for a, c in out.items()}


def choose_baseline(chosen: dict[str, ArmRun], baseline: str | None) -> str | None:
    """``--baseline ARM`` (checked), else the newest arm tagged baseline, else an arm named bf16, else none."""
    if not chosen:
        return None
    if baseline is not None:
        if baseline not in chosen:
            raise BadInput(f"--baseline {baseline!r} is not an arm of this experiment"
                           f"{did_you_mean(baseline, chosen)}; arms: {', '.join(sorted(chosen))}")
        return baseline
    flagged = [a for a, r in chosen.items() if r.baseline_tag]
    if flagged:
        return max(flagged, key=lambda a: chosen[a].start_time)
    return DEFAULT_BASELINE if DEFAULT_BASELINE in chosen else None


def arm_set(runs: list[ArmRun], baseline: str | None = None,
            first_seen: dict[str, int] | None = None) -> ArmSet:
    """The arms of ``runs`` (``first_seen``: when each arm was first run, if counted over a wider set of runs)."""
    chosen = pick_arm_runs(runs)
    base_name = choose_baseline(chosen, baseline)
    seen = first_seen if first_seen is not None else first_run_times(runs)
    order = sorted(chosen, key=lambda a: (a != base_name, seen[a], a))
    return ArmSet(chosen=chosen, order=order, baseline=base_name, skipped=skipped_runs(runs, chosen))


def first_run_times(runs: list[ArmRun]) -> dict[str, int]:
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.arm] = min(seen.get(r.arm, r.start_time), r.start_time)
    return seen


def by_gpu(runs: list[ArmRun]) -> dict[str, list[ArmRun]]:
    """Runs grouped by the GPU they measured on (a fleet study runs the same arms on several GPU types)."""
    groups: dict[str, list[ArmRun]] = {}
    for r in runs:
        groups.setdefault(r.config.gpu, []).append(r)
    return groups


# --- the paired test --------------------------------------------------------------------------------------------

NO_RECORDS = "n/a: no per-question records"


@dataclass(frozen=True)
class PairedTest:
    """Exact McNemar (and Newcombe's interval) on the questions both runs answered: the cell the tables show,
    and the comparison behind it (None when no paired test could be made: ``cell`` says why)."""

    cell: str
    comparison: PairedComparison | None = None

    def to_dict(self) -> dict[str, float | int] | None:
        pc = self.comparison
        if pc is None:
            return None
        return {"n": pc.n, "base_only": pc.base_only, "arm_only": pc.arm_only, "mcnemar_p": pc.mcnemar_p,
                "delta_paired": pc.delta, "delta_ci_low": pc.delta_ci_low, "delta_ci_high": pc.delta_ci_high}


def model_mismatch(base: ArmRun, arm: ArmRun) -> str | None:
    """Why two runs are of different models (their source digests differ), None when they are not known to be."""
    a, b = base.config.model_source_sha256, arm.config.model_source_sha256
    if a and b and a != b:
        return f"different source models ({a[:12]} vs {b[:12]})"
    return None


def paired_test(base: ArmRun, arm: ArmRun, *, allow_model_mismatch: bool = False) -> PairedTest:
    """Exact McNemar on the questions both runs answered, from their per-question outcomes. Runs of different
    source models (their ``quantrack.model_source_sha256`` differ) are not paired unless ``allow_model_mismatch``."""
    from quantrack.accuracy.stats import compare_counts, outcome_counts

    sb, sa = base.accuracy.outcomes, arm.accuracy.outcomes
    if sb is None or sa is None:
        return PairedTest(NO_RECORDS)
    why = model_mismatch(base, arm)
    if why and not allow_model_mismatch:
        return PairedTest(f"n/a: {why}; --allow-model-mismatch pairs them")
    if base.accuracy.task != arm.accuracy.task:
        return PairedTest(f"n/a: different tasks ({base.accuracy.task} vs {arm.accuracy.task})")
    db, da = base.accuracy.data_sha256, arm.accuracy.data_sha256
    if db and da and db != da:
        return PairedTest("n/a: different question sets")
    a, b, c, d = outcome_counts(sb, sa)
    if a + b + c + d == 0:
        return PairedTest("n/a: no question answered by both")
    pc = compare_counts(a, b, c, d)
    mark = "" if pc.within_noise else " *"
    return PairedTest(f"McNemar p={pc.mcnemar_p:.3g} (n={pc.n}){mark}", pc)


# --- cost -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """Derived: dated price per GPU-hour x GPUs / measured output tok/s, per 1M output tokens."""

    usd_per_1m: float
    gpu: str  # the name the price was found under
    gpu_count: int
    output_tps: float


def arm_cost(r: ArmRun, output_tps: float | None, prices: PriceTable) -> Cost | None:
    """The cost at a measured throughput, under the first of the run's GPU names that has a price; None when
    nothing was measured or no price is known."""
    from quantrack.errors import NotFound
    from quantrack.hardware.pricing import cost_per_million_tokens

    if output_tps is None or not output_tps > 0:
        return None
    for gpu in r.config.priced_gpus:
        try:
            v = cost_per_million_tokens(gpu, output_tps, prices, gpu_count=r.config.gpu_count)
        except NotFound:
            continue
        return Cost(v, gpu, r.config.gpu_count, output_tps)
    return None


# --- node facts ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeFact:
    """A node's FP8 probe run (``quantrack probe --track``)."""

    run_id: str
    hostname: str | None
    gpu_name: str | None
    verdict: str | None  # native | none
    start_time: int
    finished: bool
    fp8_speedup: dict[int, float]  # per batch (measured)


def probe_fact(r: RunRow) -> ProbeFact | None:
    """The probe fact of a node-fact run, None for a run of another kind."""
    if r.tags.get(Tag.FACT) != NodeFact.KIND_PROBE:
        return None
    speedup = {}
    for k, v in r.metrics.items():
        mm = NodeFact.FP8_SPEEDUP.match(k)
        if mm and math.isfinite(v):
            speedup[int(mm.group(1))] = v
    return ProbeFact(run_id=r.run_id, hostname=r.params.get(NodeFact.PARAM_HOSTNAME),
                     gpu_name=r.params.get(NodeFact.PARAM_GPU_NAME), verdict=r.tags.get(NodeFact.TAG_PROBE_VERDICT),
                     start_time=r.start_time, finished=r.status == RunStatus.FINISHED, fp8_speedup=speedup)


if TYPE_CHECKING:
    from quantrack.accuracy.stats import PairedComparison
    from quantrack.hardware.pricing import PriceTable

__all__ = ["Accuracy", "ArmRun", "ArmSet", "Configuration", "Contention", "Cost", "Fallback", "PairedTest",
           "ProbeFact", "SweepLevel", "arm_cost", "arm_run", "arm_set", "as_arm_runs", "by_gpu", "choose_baseline", "paired_test",
           "pick_arm_runs", "probe_fact", "run_status", "skipped_runs"]
