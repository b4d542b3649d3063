"""The arm -> MLflow record mapping: ``record_for_arm`` turns an ``ArmOutcome`` into a ``RunRecord`` (pure),
shared by ``quantrack run``, ``quantrack log`` and the fleet runner; ``study_record`` is the parent run.
Every name written here is in ``quantrack.run.schema`` (and docs/tracking.md)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.arms import Arm
from quantrack.engines import get_adapter
from quantrack.redact import argv_secret_values, redact_argv, redact_study_env, secret_values, study_env_secrets
from quantrack.run import schema
from quantrack.run.outcome import ArmOutcome
from quantrack.run.schema import Artifact, Metric, Param, Tag
from quantrack.store.records import RunRecord
from quantrack.store.tracking import provenance_tags
from quantrack.study import Study

if TYPE_CHECKING:
    from quantrack.engines.base import LogReport
    from quantrack.measure.sweep import SweepResult


def kv_figures(out: ArmOutcome) -> dict[str, float]:
    """KV cache predicted (derived) vs reported (the engine log), in MiB and cells, when both exist."""
    rep, pred = out.log_report, out.predicted
    extra = rep.extra if rep is not None else {}
    figs: dict[str, float] = {}
    rep_mib = extra.get("kv_mib")
    pred_mib = number_of(pred, "engine_kv_mib") if pred is not None else None
    if isinstance(rep_mib, (int, float)):
        figs[Metric.KV_MIB_REPORTED] = float(rep_mib)
    if pred_mib is not None:
        figs[Metric.KV_MIB_PREDICTED] = pred_mib
    if Metric.KV_MIB_REPORTED in figs and pred_mib:
        figs[Metric.KV_MIB_ERROR_PCT] = (figs[Metric.KV_MIB_REPORTED] - pred_mib) / pred_mib * 100.0
    if isinstance(extra.get("kv_cells"), int):
        figs[Metric.KV_CELLS_PER_STREAM] = float(extra["kv_cells"])
        figs[Metric.KV_STREAMS] = float(extra.get("kv_streams") or 1)
    return figs


def number_of(obj: Any, *names: str) -> float | None:
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            return float(v)
    return None


def outcomes_bitmap(records_path: Path | None) -> tuple[str | None, str | None]:
    """Per-question outcomes as a compact tag ('1' right, '0' wrong, '.' unanswered) + the data hash."""
    if records_path is None or not Path(records_path).is_file():
        return None, None
    from quantrack.accuracy.gsm8k import MAX_POOL, outcome_position
    from quantrack.accuracy.records import load_records, read_meta

    recs = load_records(Path(records_path))
    pos = {qid: outcome_position(qid) for qid in recs}
    if not recs or max(pos.values()) >= MAX_POOL:
        return None, None
    chars = ["."] * (max(pos.values()) + 1)
    for qid, r in recs.items():
        if r.answered:
            chars[pos[qid]] = "1" if r.correct else "0"
    meta = read_meta(Path(records_path)) or {}
    return "".join(chars), meta.get("data_sha256")


TAG_LIMIT = 8000  # MLflow's longest tag value (mlflow.utils.validation.MAX_TAG_VAL_LENGTH)


def outcome_chunks(bitmap: str | None) -> list[str | None]:
    """The outcome string in tags of at most 8,000 characters: the first under ``quantrack.gsm8k_correct``, the
    rest under ``.1``, ``.2`` ... (a reader joins them: :func:`quantrack.report.armrun.arm_run`)."""
    if bitmap is None:
        return [None]
    return [bitmap[i:i + TAG_LIMIT] for i in range(0, len(bitmap), TAG_LIMIT)]


def study_secrets(study: Study) -> list[str]:
    """Every secret value a study file holds: its engine's and arms' env values that are not known settings
    (``DB_PASS``, ``GITHUB_PAT``...) and the values of secret engine flags (``-hft``, ``--api-key=``) in
    ``[engine] args`` and each arm's args; scrubbed by value from everything recorded, the study file too."""
    env: dict[str, str] = dict(study.engine.env)
    argv: list[str] = list(study.engine.args)
    vals: list[str] = []
    for arm in study.arms:
        vals += study_env_secrets(arm.env_dict)
        vals += argv_secret_values(arm.engine_args)
    return [*study_env_secrets(env), *argv_secret_values(argv), *vals]


def record_for_arm(study: Study, out: ArmOutcome, *, experiment: str, parent_uuid: str | None = None,
                   baseline_accuracy: float | None = None, extra_secrets: tuple[str, ...] = ()) -> RunRecord:
    """The run for one arm: fixed param/metric/tag names (quantrack.run.schema, docs/tracking.md)."""
    arm = out.arm
    rec = RunRecord(experiment=experiment, run_name=arm.name, parent_uuid=parent_uuid, start_ms=out.start_ms,
                    uuid=out.run_uuid)
    rec.secrets = secret_values({**dict(study.engine.env), **out.launch_env, **arm.env_dict},
                                [*extra_secrets, *study_secrets(study)])
    _params(rec, study, out)
    _tags(rec, study, out)
    _metrics(rec, out, baseline_accuracy)
    _artifacts(rec, out)
    rec.status = out.status if out.status != "RUNNING" else "FAILED"
    rec.end_ms = int(time.time() * 1000)
    return rec


def _params(rec: RunRecord, study: Study, out: ArmOutcome) -> None:
    arm, rep, live, node = out.arm, out.log_report, out.live, out.node
    # what was run, where
    rec.param(Param.STUDY, study.name)
    rec.param(Param.ARM, arm.name)
    rec.param(Param.ENGINE, study.engine.kind)
    rec.param(Param.ENGINE_VERSION, (rep.engine_version if rep is not None else None) or (live.engine_version if live is not None else None)
              or study.engine.version)
    rec.param(Param.MODEL, arm.model or study.model.path or study.model.gguf or study.model.name)
    rec.param(Param.MODEL_NAME, study.model.name)
    rec.param(Param.MODEL_REF, out.model_ref)
    rec.param(Param.MODEL_REVISION, study.model.revision)
    rec.param(Param.WEIGHTS, arm.weights)
    rec.param(Param.QUANTIZATION, arm.quantization or "none")
    rec.param(Param.KV_CACHE_DTYPE, arm.kv)
    rec.param(Param.KV_CACHE_DTYPE_EFFECTIVE, _effective_kv(arm, rep))
    rec.param(Param.DTYPE, arm.dtype)
    rec.param(Param.DTYPE_EFFECTIVE, rep.dtype if rep is not None else None)
    rec.param(Param.ENGINE_ARGS, list(redact_argv(arm.engine_args)) or None)
    rec.param(Param.GPU_NAME, node.get("gpu_name") or (study.gpu.name if study.gpu.name != "auto" else None))
    rec.param(Param.GPU_CATALOG, study.gpu.name)
    rec.param(Param.COMPUTE_CAPABILITY, node.get("compute_capability"))
    rec.param(Param.DRIVER, node.get("driver"))
    rec.param(Param.CUDA_DRIVER, node.get("cuda_driver"))
    rec.param(Param.CUDA, study.gpu.cuda)
    rec.param(Param.MIG, node.get("mig"))
    rec.param(Param.HOSTNAME, node.get("hostname"))
    rec.param(Param.GPU_UTIL, study.gpu.util)
    rec.param(Param.MAX_MODEL_LEN, study.context_len)
    rec.param(Param.TP, study.gpu.count)
    rec.param(Param.PARALLEL, study.parallel if get_adapter(study.engine.kind).memory.slots else None)
    rec.param(Param.INPUT_TOKENS, study.latency.input_tokens)
    rec.param(Param.OUTPUT_TOKENS, study.latency.output_tokens)
    rec.param(Param.LATENCY_WARMUP, study.latency.warmup)
    rec.param(Param.LATENCY_ITERATIONS, study.latency.iterations)
    rec.param(Param.LATENCY_ENDPOINT, "chat" if study.latency.chat else "completions")
    if study.sweep.concurrency:
        rec.param(Param.SWEEP_CONCURRENCY, ",".join(str(c) for c in study.sweep.concurrency))
    if study.sweep.rates:
        rec.param(Param.SWEEP_RATES, ",".join(f"{r:g}" for r in study.sweep.rates))
        rec.param(Param.SWEEP_ARRIVAL, study.sweep.arrival)
        rec.param(Param.SWEEP_SEED, study.sweep.seed)
        rec.param(Param.SWEEP_MAX_CONCURRENCY, study.sweep.max_concurrency or "none")
    if study.sweep.concurrency or study.sweep.rates or study.sweep.search_mode != "measured":
        rec.param(Param.SWEEP_GOODPUT_SLO, study.sweep.goodput)
        rec.param(Param.SWEEP_REPEATS, study.sweep.repeats)
        rec.param(Param.SWEEP_DATASET, study.sweep.dataset)
        rec.param(Param.SWEEP_RANGE_RATIO, study.sweep.range_ratio)
    if study.sweep.search_mode != "measured":
        sw = study.sweep
        rec.param(Param.SWEEP_SLO_SEARCH_PROBE, f"{sw.search_mode} {sw.search_range}, tolerance "
                  f"{sw.search_tolerance:g}, x{sw.search_repeats}")
    if study.eval.task:
        rec.param(Param.EVAL_TASK, study.eval.task)
        rec.param(Param.EVAL_NUM_QUESTIONS, study.eval.num_questions)
        rec.param(Param.EVAL_NUM_SHOTS, study.eval.num_shots)
        rec.param(Param.EVAL_MAX_TOKENS, study.eval.max_tokens)
        rec.param(Param.EVAL_SEED, study.eval.seed)
        rec.param(Param.EVAL_STYLE, study.eval.style)
    if study.kl_wanted(arm):
        rec.param(Param.KL_TOKENS, study.eval.kl_tokens)
        rec.param(Param.KL_TOP_K, study.eval.kl_top_k)
        rec.param(Param.KL_METHOD, study.eval.kl_method)
        rec.param(Param.KL_BASELINE, study.baseline.name)


def study_sha256(study: Study) -> str | None:
    """SHA-256 of the study file as run (None when the study was not read from a file)."""
    import hashlib

    if not study.source or not Path(study.source).is_file():
        return None
    return hashlib.sha256(Path(study.source).read_bytes()).hexdigest()


def _tags(rec: RunRecord, study: Study, out: ArmOutcome) -> None:
    arm, rep = out.arm, out.log_report
    for k, v in provenance_tags().items():
        rec.tag(k, v)
    rec.tag(Tag.STUDY_SHA256, study_sha256(study))
    w = out.weights
    if w is not None:
        rec.tag(Tag.MODEL_SHA256, w.model_sha256)
        rec.tag(Tag.MODEL_SOURCE_SHA256, w.source_sha256)
        rec.tag(Tag.MODEL_SHA256_UNKNOWN, w.reason or None)
    rec.tag(Tag.ROLE, "arm")
    if study.quick:
        rec.tag(Tag.QUICK, "true")
    rec.tag(Tag.STUDY, study.name)
    rec.tag(Tag.ARM, arm.name)
    rec.tag(Tag.SOURCE, out.source)
    rec.tag(Tag.BASELINE, "true" if arm.baseline else "false")
    rec.tag(Tag.VERDICT, out.verdict)
    rec.tag(Tag.RULE_IDS, ",".join(sorted({v.rule_id for v in out.verdicts if v.verdict != "allow"} - {""}))
            or None)
    if out.error:
        rec.tag(Tag.ERROR, out.error)
        rec.tag(Tag.FAILED_STEP, out.failed_step)
    if rep is not None:
        fbs = rep.fallbacks
        state = fallback_state(rep)
        gate = _fp8_gate(study, out) if state == schema.FALLBACK_NO else None
        rec.tag(Tag.FALLBACK, gate.state if gate is not None else state)
        if state == schema.FALLBACK_UNKNOWN:
            rec.tag(Tag.FALLBACK_REASON, "the log does not show the engine loading the weights (no "
                                         f"{rep.engine or 'engine'} load line): a fallback cannot be ruled out")
        if gate is not None:  # no fallback line, but the GPU's FP8 gate decides (issue #41: FP8 below SM89)
            if gate.state == schema.FALLBACK_YES:
                rec.tag(Tag.FALLBACK_KINDS, gate.kind)
                rec.tag(Tag.FALLBACK_EVIDENCE, f"rule {gate.rule}: {gate.reason}")
            else:
                rec.tag(Tag.FALLBACK_REASON, gate.reason)
        if fbs:
            rec.tag(Tag.FALLBACK_KINDS, ",".join(sorted({e.kind for e in fbs})))
            rec.tag(Tag.FALLBACK_EVIDENCE, f"{Path(str(rep.source or 'log')).name}:{fbs[0].line_no}: "
                                                    f"{fbs[0].line.strip()}")
        rec.tag(Tag.EFFECTIVE_KERNEL, rep.linear_kernel)
        rec.tag(Tag.ATTENTION_BACKEND, rep.attention_backend)
        rec.tag(Tag.LOG_QUANTIZATION, rep.quantization)
        rec.tag(Tag.LOG_NOT_FOUND, ",".join(rep.not_found) or None)
        if rep.kv_scales:
            rec.tag(Tag.KV_SCALE_SOURCE, rep.kv_scales.get("source"))
            ev = (rep.kv_scales.get("evidence") or [None])[0]
            rec.tag(Tag.KV_SCALE_EVIDENCE, f"{Path(str(rep.source or 'log')).name}:{ev['line_no']}: "
                                           f"{ev['line'][:300]}" if ev else rep.kv_scales.get("reason"))
    _kv_plan_tags(rec, study, arm)
    rec.tag(Tag.DERIVED_METRICS, ",".join(schema.DERIVED_METRICS))


def _kv_plan_tags(rec: RunRecord, study: Study, arm: Arm) -> None:
    """What preflight's KV-scale plan said for this arm (quantrack.engines.kvplan), beside what the log showed."""
    from quantrack.engines import plan_scales
    from quantrack.engines.kvplan import checkpoint_for
    from quantrack.errors import QuantrackError

    try:
        plan = plan_scales(arm, study.engine.kind, engine_version=study.engine.version,
                           checkpoint=checkpoint_for(arm.model or study.model.path), engine_args=study.engine.args)
    except QuantrackError:
        return
    if plan is not None:
        rec.tag(Tag.KV_SCALE_PLANNED, plan.source.value)
        rec.tag(Tag.KV_SCALE_RULE, plan.rule_id)


def _metrics(rec: RunRecord, out: ArmOutcome, baseline_accuracy: float | None) -> None:
    rep = out.log_report
    # metrics: capacity (measured from the log; predicted is derived)
    if rep is not None:
        rec.metric(Metric.WEIGHTS_GIB, rep.weights_gib)
        rec.metric(Metric.KV_TOKENS_REPORTED, rep.kv_cache_tokens)
        rec.metric(Metric.AVAILABLE_KV_GIB, rep.available_kv_gib)
        rec.metric(Metric.MAX_CONCURRENCY, rep.max_concurrency)
        rec.metric(Metric.CUDA_GRAPH_GIB, rep.cuda_graph_gib)
    predicted_tokens = number_of(out.predicted or {}, "engine_tokens")
    rec.metric(Metric.KV_TOKENS_PREDICTED, predicted_tokens)
    reported = rep.kv_cache_tokens if rep is not None else None
    if predicted_tokens and reported is not None:
        rec.metric(Metric.CAPACITY_ERROR_PCT, (reported - predicted_tokens) / predicted_tokens * 100.0)
    for key, value in kv_figures(out).items():
        rec.metric(key, value)
    for step, seconds in out.step_s.items():
        rec.metric(schema.step_seconds(step), seconds)
    _latency_metrics(rec, out)
    _sweep_metrics(rec, out.sweep)
    _hygiene(rec, out)
    _eval_metrics(rec, out, baseline_accuracy)
    if out.kl is not None:
        for name, value in out.kl.metrics().items():
            rec.metric(name, value)


def _hygiene(rec: RunRecord, out: ArmOutcome) -> None:
    """Host/GPU contention per timed step (measured; the yes/no flag derived with the limits it records), and
    the latency's repeatability (CV of per-request TPOT)."""
    for step, h in out.hygiene.items():
        for name, value in h.metrics().items():
            rec.metric(name, value)
        for tag, text in h.tags().items():
            rec.tag(tag, text or None)
        rec.artifacts[Artifact.HYGIENE.format(step=step)] = json.dumps(h.to_dict(), indent=1, default=str)
    if out.latency is not None:
        from quantrack.measure.hygiene import cv

        rec.metric(Metric.TPOT_CV, cv([s.tpot for s in out.latency.ok_samples if s.tpot is not None]))


def _artifacts(rec: RunRecord, out: ArmOutcome) -> None:
    rep = out.log_report
    if out.weights is not None:
        rec.artifacts[Artifact.PROVENANCE_WEIGHTS] = json.dumps(out.weights.to_dict(), indent=1, sort_keys=True)
    if out.launch_argv:
        rec.artifacts[Artifact.LAUNCH_COMMAND] = " ".join(redact_argv(out.launch_argv, rec.secrets)) + "\n"
        rec.artifacts[Artifact.LAUNCH_ENV] = json.dumps(redact_study_env(out.launch_env), indent=1, sort_keys=True)
    if out.server_log is not None and Path(out.server_log).is_file():
        rec.artifact_files[schema.server_log(Path(out.server_log).name)] = str(out.server_log)
    if rep is not None:
        rec.artifacts[Artifact.SERVER_LOG_REPORT] = json.dumps(rep.to_dict(), indent=1, default=str)
    if out.live:
        rec.artifacts[Artifact.SERVER_LIVE] = json.dumps(out.live.to_dict(), indent=1, default=str)
    if out.latency is not None:
        rec.artifacts[Artifact.LATENCY_LATENCY] = json.dumps(out.latency.to_row(), indent=1, default=str)
    elif out.latency_row is not None:
        rec.artifacts[Artifact.LATENCY_LATENCY] = json.dumps(out.latency_row, indent=1, default=str)
    if out.sweep is not None:
        rec.artifacts[Artifact.SWEEP_SWEEP] = json.dumps(out.sweep.to_dict(), indent=1, default=str)
    if out.eval is not None:
        rec.artifacts[Artifact.EVAL_RESULT] = json.dumps(out.eval.to_dict(), indent=1, default=str)
    if out.eval_records is not None and Path(out.eval_records).is_file():
        rec.artifact_files[Artifact.EVAL_RECORDS] = str(out.eval_records)
    if out.kl is not None:
        rec.artifacts[Artifact.KL_RESULT] = json.dumps(out.kl.to_dict(), indent=1, default=str)
    for rel, png in out.plots.items():
        if Path(png).is_file():
            rec.artifact_files[rel] = str(png)
    if out.verdicts:
        rec.artifacts[Artifact.PREFLIGHT_VERDICTS] = json.dumps(
            [v.to_dict() for v in out.verdicts], indent=1, default=str)


def _fp8_gate(study: Study, out: ArmOutcome) -> Any:
    """The rulebook's FP8 gate for an arm whose log shows no fallback: FP8 weights on a GPU below SM89 are a fallback
    whether or not the engine printed it (``hardware.rulebook.fallback_gate``, as ``audit`` reads it); None when it
    has nothing to add."""
    from quantrack.hardware.rulebook import fallback_gate, parse_cc

    rep, node = out.log_report, out.node
    if rep is None:
        return None
    cc = parse_cc(node.get("compute_capability"))
    if cc is None and not node.get("gpu_name"):
        return None  # no GPU facts on this node (CPU, --base-url elsewhere): audit reads the gate with --gpu
    return fallback_gate(rep.engine or study.engine.kind, quantization=out.arm.quantization or rep.quantization,
                         weights=out.arm.weights, kernel=rep.linear_kernel, cc=cc, gpu=node.get("gpu_name"),
                         engine_version=rep.engine_version)


def fallback_state(rep: LogReport) -> str:
    """``yes`` (the log shows a fallback), ``no`` (a log of a known engine that got as far as loading the
    weights, ``EngineAdapter.loaded``, and shows none), else ``unknown``: a log that says nothing is never
    read as "no fallback" (the same rule as ``quantrack audit``)."""
    if rep.fallbacks:
        return schema.FALLBACK_YES
    if rep.engine is None:
        return schema.FALLBACK_UNKNOWN
    if get_adapter(rep.engine).loaded(rep):
        return schema.FALLBACK_NO
    return schema.FALLBACK_UNKNOWN


def _effective_kv(arm: Arm, rep: LogReport | None) -> str | None:
    """The KV dtype the engine stored, from its log: 'auto' resolves to the log's activation dtype."""
    if rep is None:
        return None
    kv, dtype = rep.kv_cache_dtype, rep.dtype
    if kv and kv != "auto":
        return str(kv)
    return str(dtype) if kv == "auto" and dtype else None


def _latency_metrics(rec: RunRecord, out: ArmOutcome) -> None:
    lat = out.latency
    if lat is not None:
        st = lat.stats()
        for key, s in st.items():
            if s is None:
                continue
            if key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "server_tpot_ms"):
                rec.metric(schema.latency_stat(key, "p50"), s.median)
                rec.metric(schema.latency_stat(key, "mean"), s.mean)
            if key in ("itl_ms", "ttft_ms", "tpot_ms"):
                rec.metric(schema.latency_stat(key, "p90"), s.p90)
                rec.metric(schema.latency_stat(key, "p95"), s.p95)
                rec.metric(schema.latency_stat(key, "p99"), s.p99)
            if key in ("tpot_ms", "ttft_ms") and s.ci95_low is not None:
                rec.metric(schema.latency_stat(key, "ci_low"), s.ci95_low)
                rec.metric(schema.latency_stat(key, "ci_high"), s.ci95_high)
            if key == "decode_tok_s":
                rec.metric(Metric.DECODE_TOK_S_P50, s.median)
        ok = lat.ok_samples
        rec.metric(Metric.LATENCY_N_OK, len(ok))
        rec.metric(Metric.LATENCY_N_FAILED, lat.n_failed)
        server = st.get("server_tpot_ms")
        rec.metric(Metric.SERVER_TPOT_MS, server.median if server is not None else None)
        rec.metric(Metric.TPOT_VS_SERVER_PCT, lat.tpot_vs_server_median_pct())
        rec.series(Metric.SAMPLE_TPOT_MS, [s.tpot * 1000 for s in ok if s.tpot is not None])
        rec.series(Metric.SAMPLE_TTFT_MS, [s.ttft * 1000 for s in ok if s.ttft is not None])
        return
    _latency_row_metrics(rec, out.latency_row)


def _latency_row_metrics(rec: RunRecord, row: dict[str, Any] | None) -> None:
    """An imported latency row (quantrack log): quantrack's saved row or the reference client's JSON."""
    if row is None:
        return
    for key, name in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "itl_ms"), ("e2e_ms", "e2e_ms"),
                      ("server_tpot_ms", "server_tpot_ms")):
        s = row.get(key)
        if isinstance(s, dict):
            rec.metric(schema.latency_stat(name, "p50"), s.get("median"))
            rec.metric(schema.latency_stat(name, "mean"), s.get("mean"))
            if key in ("itl_ms", "ttft_ms", "tpot_ms"):
                rec.metric(schema.latency_stat(name, "p90"), s.get("p90"))
                rec.metric(schema.latency_stat(name, "p95"), s.get("p95"))
                rec.metric(schema.latency_stat(name, "p99"), s.get("p99"))
            if key in ("tpot_ms", "ttft_ms"):
                rec.metric(schema.latency_stat(name, "ci_low"), s.get("ci95_low"))
                rec.metric(schema.latency_stat(name, "ci_high"), s.get("ci95_high"))
    if isinstance(row.get("server_tpot_ms"), dict):
        rec.metric(Metric.SERVER_TPOT_MS, row["server_tpot_ms"].get("median"))
    rec.metric(Metric.LATENCY_N_OK, row.get("n_ok"))
    rec.metric(Metric.LATENCY_N_FAILED, row.get("n_failed"))
    samples = row.get("samples") or []
    rec.series(Metric.SAMPLE_TPOT_MS, [s["tpot_ms"] for s in samples if isinstance(s, dict) and s.get("ok", True)
                                  and isinstance(s.get("tpot_ms"), (int, float))])
    # the lab's reference client (the lab reference client latency.py): medians over its measured batch-1 requests,
    # and per concurrency level the median TPOT/TTFT and the output tokens/s of the level
    b1 = row.get("batch1")
    if isinstance(b1, dict):
        rec.metric(Metric.TTFT_MS_P50, b1.get("ttft_ms"))
        rec.metric(Metric.TPOT_MS_P50, b1.get("tpot_ms"))
        rec.metric(Metric.E2E_MS_P50, b1.get("e2e_ms"))
        if isinstance(b1.get("tokens"), list):
            rec.metric(Metric.LATENCY_N_OK, len(b1["tokens"]))
    for key, val in row.items():
        if key.startswith("conc") and key[4:].isdigit() and isinstance(val, dict):
            c = int(key[4:])
            rec.metric(schema.sweep_output_tps(c), val.get("out_tok_per_s"))
            rec.metric(schema.sweep_tpot_p50(c), val.get("tpot_ms"))
            rec.metric(schema.sweep_ttft_p50(c), val.get("ttft_ms"))




_LEVEL_FIGURES = schema.LEVEL_FIGURES


def _dig(row: Any, path: tuple[str, ...]) -> float | None:
    for k in path:
        row = row.get(k) if isinstance(row, dict) else None
    return float(row) if isinstance(row, (int, float)) and not isinstance(row, bool) else None


def _sweep_metrics(rec: RunRecord, sweep: SweepResult | None) -> None:
    if sweep is None:
        return
    from quantrack.measure.sweep import level_label

    # SweepResult.rows: one dict per level (concurrency or rate, output_tok_s, request_s, ...)
    for lv in sweep.rows:
        label = level_label(lv)
        c = number_of(lv, "concurrency")
        if lv.get("mode") != "rate" and c is not None:
            ci = int(c)
            rec.metric(schema.sweep_output_tps(ci), number_of(lv, "output_tok_s"))
            rec.metric(schema.sweep_tpot_p50(ci), number_of(lv, "tpot_p50_ms"))
            rec.metric(schema.sweep_ttft_p50(ci), number_of(lv, "ttft_p50_ms"))
            rec.metric(schema.sweep_request_tps(ci), number_of(lv, "request_s"))
        elif lv.get("mode") == "rate":
            rec.metric(schema.sweep_level("output_tps", label), number_of(lv, "output_tok_s"))
            rec.metric(schema.sweep_level("tpot_ms_p50", label), number_of(lv, "tpot_p50_ms"))
            rec.metric(schema.sweep_level("ttft_ms_p50", label), number_of(lv, "ttft_p50_ms"))
            rec.metric(schema.sweep_level("request_tps", label), number_of(lv, "request_s"))
            rec.metric(schema.sweep_level("achieved_rate", label), number_of(lv, "achieved_rate"))
        for figure, path in _LEVEL_FIGURES:
            value = _dig(lv, path)
            if value is None and figure == "engine_prefix_hit_rate":  # a sweep saved before the level figure
                value = _dig(lv, ("server_metrics", "prefix_cache_hit_rate"))
            rec.metric(schema.sweep_level(figure, label), value)
    if sweep.rows:
        rec.tag(Tag.SWEEP_DATASET, (sweep.load or {}).get("dataset") or "random")
        top = max(sweep.rows, key=lambda r: float(r.get("rate" if r.get("mode") == "rate" else "concurrency") or 0))
        why = (top.get("prefix_cache") or {}).get("unknown") if top.get("prefix_cache_hit_rate") is None else None
        if why:
            rec.tag(Tag.SWEEP_PREFIX_UNKNOWN, str(why)[:500])
    s = sweep.slo_search
    if s:
        rec.tag(Tag.SLO_SEARCH, s.get("criterion"))
        rec.tag(Tag.SLO_SEARCH_MODE, s.get("mode"))
        rec.tag(Tag.SLO_SEARCH_FIRST_MISS, "none" if s.get("first_miss") is None else f"{s['first_miss']:g}")
        if s.get("method") == "probe":  # the probing search: its answer is the bracket, and why it stopped
            rec.tag(Tag.SLO_SEARCH_METHOD, "probe")
            rec.tag(Tag.SLO_SEARCH_STOP, f"{s.get('stop')}: {s.get('stop_text')}"[:500])
        lim = s.get("limit")
        rec.metric(schema.SWEEP_SLO_LIMIT, float(lim) if isinstance(lim, (int, float)) else None)


def eval_prefix(ev: Any) -> str:
    """The prefix of an eval result's metrics: the task's name for a task file or humaneval (a result of
    ``quantrack.accuracy.tasks.run_task``, which records the task's SHA-256), else ``gsm8k``."""
    if ev is not None and (ev.settings or {}).get("task_sha256"):
        return schema.task_prefix(ev.task)
    return schema.GSM8K_PREFIX


def _eval_metrics(rec: RunRecord, out: ArmOutcome, baseline_accuracy: float | None) -> None:
    ev = out.eval
    if ev is None:
        return
    names = schema.accuracy_names(eval_prefix(ev))
    # an accuracy-only import (SGLang run_eval without --num-questions) has no count: n/correct not recorded
    counted = ev.n > 0
    rec.metric(names.accuracy, ev.accuracy)
    rec.metric(names.se, ev.se)
    rec.metric(names.ci_low, ev.ci_low)
    rec.metric(names.ci_high, ev.ci_high)
    rec.metric(names.n, ev.n if counted else None)
    rec.metric(names.correct, ev.correct if counted else None)
    rec.metric(names.invalid, ev.invalid)
    rec.metric(names.errors, ev.errors if counted else None)
    rec.tag(names.source_tag, ev.source)
    rec.tag(Tag.EVAL_METRICS, names.prefix)
    if ev.accuracy is not None and baseline_accuracy is not None and not out.arm.baseline:
        rec.metric(names.delta_vs_baseline, ev.accuracy - baseline_accuracy)
    given = ev.extra.get("outcomes") if isinstance(ev.extra, dict) else None
    bitmap, sha = (given, None) if isinstance(given, str) else outcomes_bitmap(out.eval_records)
    for i, chunk in enumerate(outcome_chunks(bitmap)):
        rec.tag(names.outcomes_tag if i == 0 else f"{names.outcomes_tag}.{i}", chunk)
    rec.tag(Tag.EVAL_TASK, ev.task)
    rec.tag(Tag.EVAL_ORDER, (ev.settings or {}).get("order"))
    b = ev.extra.get("budget") if isinstance(ev.extra, dict) else None
    if isinstance(b, dict):
        rec.tag(Tag.BUDGET_VERDICT, b.get("verdict"))
        rec.tag(Tag.BUDGET_METHOD, b.get("method"))
        rec.tag(Tag.BUDGET_BASELINE, b.get("baseline"))
        for metric, key in ((Metric.BUDGET_PP, "budget_pp"), (Metric.BUDGET_LOW_PP, "low"),
                            (Metric.BUDGET_HIGH_PP, "high"), (Metric.BUDGET_QUESTIONS_USED, "questions_used"),
                            (Metric.BUDGET_MORE_QUESTIONS, "more_questions")):
            rec.metric(metric, number_of(b, key))
    rec.tag(names.data_sha256_tag, sha or (ev.settings or {}).get("data_sha256"))


def study_record(study: Study, experiment: str, node: dict[str, Any]) -> RunRecord:
    rec = RunRecord(experiment=experiment, run_name=f"study:{study.name}", status="RUNNING")
    rec.secrets = secret_values(dict(study.engine.env), study_secrets(study))
    if study.quick:
        rec.tag(Tag.QUICK, "true")
    for k, v in provenance_tags().items():
        rec.tag(k, v)
    rec.tag(Tag.STUDY_SHA256, study_sha256(study))
    rec.tag(Tag.ROLE, "study")
    rec.tag(Tag.STUDY, study.name)
    rec.param(Param.STUDY, study.name)
    rec.param(Param.ENGINE, study.engine.kind)
    rec.param(Param.ENGINE_VERSION, study.engine.version)
    rec.param(Param.MODEL, study.model.path or study.model.gguf or study.model.name)
    rec.param(Param.GPU_CATALOG, study.gpu.name)
    rec.param(Param.GPU_NAME, node.get("gpu_name"))
    rec.param(Param.HOSTNAME, node.get("hostname"))
    rec.param(Param.ARMS, ",".join(a.name for a in study.arms))
    rec.param(Param.BASELINE, study.baseline.name)
    rec.param(Param.MAX_MODEL_LEN, study.context_len)
    if study.source and Path(study.source).is_file():
        rec.artifact_files[Artifact.STUDY_STUDY] = study.source
    return rec
