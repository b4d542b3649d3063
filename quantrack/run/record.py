"""The arm -> MLflow record mapping: ``record_for_arm`` turns an ``ArmOutcome`` into a ``RunRecord`` (pure),
shared by ``quantrack run``, ``quantrack log`` and the fleet runner; ``study_record`` is the parent run.
Every name written here is in ``quantrack.run.schema`` (and docs/tracking.md)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from quantrack.arms import Arm
from quantrack.redact import redact_argv, redact_env, secret_values
from quantrack.run.outcome import ArmOutcome
from quantrack.study import Study
from quantrack.tracking import RunRecord, provenance_tags


def kv_figures(out: ArmOutcome) -> dict[str, float]:
    """KV cache predicted (derived) vs reported (the engine log), in MiB and cells, when both exist."""
    rep, pred = out.log_report, out.predicted
    extra = getattr(rep, "extra", None) or {}
    figs: dict[str, float] = {}
    rep_mib = extra.get("kv_mib")
    pred_mib = _num(pred, "engine_kv_mib") if pred is not None else None
    if isinstance(rep_mib, (int, float)):
        figs["kv_mib_reported"] = float(rep_mib)
    if pred_mib is not None:
        figs["kv_mib_predicted"] = pred_mib
    if "kv_mib_reported" in figs and pred_mib:
        figs["kv_mib_error_pct"] = (figs["kv_mib_reported"] - pred_mib) / pred_mib * 100.0
    if isinstance(extra.get("kv_cells"), int):
        figs["kv_cells_per_stream"] = float(extra["kv_cells"])
        figs["kv_streams"] = float(extra.get("kv_streams") or 1)
    return figs


def _num(obj: Any, *names: str) -> float | None:
    for n in names:
        v = obj.get(n) if isinstance(obj, dict) else getattr(obj, n, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            return float(v)
    return None


def outcomes_bitmap(records_path: Path | None) -> tuple[str | None, str | None]:
    """Per-question outcomes as a compact tag ('1' right, '0' wrong, '.' unanswered) + the data hash."""
    if records_path is None or not Path(records_path).is_file():
        return None, None
    from quantrack.accuracy.records import load_records, read_meta

    recs = load_records(Path(records_path))
    if not recs or max(recs) >= 8000:
        return None, None
    chars = ["."] * (max(recs) + 1)
    for qid, r in recs.items():
        if r.answered:
            chars[qid] = "1" if r.correct else "0"
    meta = read_meta(Path(records_path)) or {}
    return "".join(chars), meta.get("data_sha256")


def record_for_arm(study: Study, out: ArmOutcome, *, experiment: str, parent_uuid: str | None = None,
                   baseline_accuracy: float | None = None, extra_secrets: tuple[str, ...] = ()) -> RunRecord:
    """The run for one arm: fixed param/metric/tag names (docs/tracking.md)."""
    arm = out.arm
    rec = RunRecord(experiment=experiment, run_name=arm.name, parent_uuid=parent_uuid, start_ms=out.start_ms)
    rec.secrets = secret_values({**dict(study.engine.env), **out.launch_env, **arm.env_dict}, extra_secrets)
    rep, live, node = out.log_report, out.live or {}, out.node
    # params: what was run, where
    rec.param("study", study.name)
    rec.param("arm", arm.name)
    rec.param("engine", study.engine.kind)
    rec.param("engine_version", getattr(rep, "engine_version", None) or live.get("engine_version")
              or study.engine.version)
    rec.param("model", arm.model or study.model.path or study.model.gguf or study.model.name)
    rec.param("model_name", study.model.name)
    rec.param("model_ref", out.model_ref)
    rec.param("model_revision", study.model.revision)
    rec.param("weights", arm.weights)
    rec.param("quantization", arm.quantization or "none")
    rec.param("kv_cache_dtype", arm.kv)
    rec.param("kv_cache_dtype_effective", _effective_kv(arm, rep))
    rec.param("dtype", arm.dtype)
    rec.param("dtype_effective", getattr(rep, "dtype", None))
    rec.param("engine_args", list(redact_argv(arm.engine_args)) or None)
    rec.param("gpu_name", node.get("gpu_name") or (study.gpu.name if study.gpu.name != "auto" else None))
    rec.param("gpu_catalog", study.gpu.name)
    rec.param("compute_capability", node.get("compute_capability"))
    rec.param("driver", node.get("driver"))
    rec.param("cuda_driver", node.get("cuda_driver"))
    rec.param("cuda", study.gpu.cuda)
    rec.param("mig", node.get("mig"))
    rec.param("hostname", node.get("hostname"))
    rec.param("gpu_util", study.gpu.util)
    rec.param("max_model_len", study.context_len)
    rec.param("tp", study.gpu.count)
    rec.param("parallel", study.parallel if study.engine.kind == "llamacpp" else None)
    rec.param("input_tokens", study.latency.input_tokens)
    rec.param("output_tokens", study.latency.output_tokens)
    rec.param("latency_warmup", study.latency.warmup)
    rec.param("latency_iterations", study.latency.iterations)
    rec.param("latency_endpoint", "chat" if study.latency.chat else "completions")
    if study.sweep.concurrency:
        rec.param("sweep_concurrency", ",".join(str(c) for c in study.sweep.concurrency))
    if study.eval.task:
        rec.param("eval_task", study.eval.task)
        rec.param("eval_num_questions", study.eval.num_questions)
        rec.param("eval_num_shots", study.eval.num_shots)
        rec.param("eval_max_tokens", study.eval.max_tokens)
        rec.param("eval_seed", study.eval.seed)
        rec.param("eval_style", study.eval.style)
    if study.kl_wanted(arm):
        rec.param("kl_tokens", study.eval.kl_tokens)
        rec.param("kl_top_k", study.eval.kl_top_k)
        rec.param("kl_baseline", study.baseline.name)
    # tags
    for k, v in provenance_tags().items():
        rec.tag(k, v)
    rec.tag("quantrack.role", "arm")
    rec.tag("quantrack.study", study.name)
    rec.tag("quantrack.arm", arm.name)
    rec.tag("quantrack.source", out.source)
    rec.tag("quantrack.baseline", "true" if arm.baseline else "false")
    rec.tag("quantrack.verdict", out.verdict)
    rec.tag("quantrack.rule_ids", ",".join(sorted({getattr(v, "rule_id", "") for v in out.verdicts
                                                    if getattr(v, "verdict", "allow") != "allow"} - {""})) or None)
    if out.error:
        rec.tag("quantrack.error", out.error)
        rec.tag("quantrack.failed_step", out.failed_step)
    if rep is not None:
        fbs = list(getattr(rep, "fallbacks", []) or [])
        rec.tag("quantrack.fallback", "yes" if fbs else "no")
        if fbs:
            rec.tag("quantrack.fallback_kinds", ",".join(sorted({e.kind for e in fbs})))
            rec.tag("quantrack.fallback_evidence", f"{Path(str(rep.source or 'log')).name}:{fbs[0].line_no}: "
                                                    f"{fbs[0].line.strip()}")
        rec.tag("quantrack.effective_kernel", getattr(rep, "linear_kernel", None))
        rec.tag("quantrack.attention_backend", getattr(rep, "attention_backend", None))
        rec.tag("quantrack.log_quantization", getattr(rep, "quantization", None))
        rec.tag("quantrack.log_not_found", ",".join(getattr(rep, "not_found", []) or []) or None)
    # metrics: capacity (measured from the log; predicted is derived)
    if rep is not None:
        rec.metric("weights_gib", rep.weights_gib)
        rec.metric("kv_tokens_reported", rep.kv_cache_tokens)
        rec.metric("available_kv_gib", rep.available_kv_gib)
        rec.metric("max_concurrency", rep.max_concurrency)
        rec.metric("cuda_graph_gib", rep.cuda_graph_gib)
    predicted_tokens = _num(out.predicted, "engine_tokens")
    rec.metric("kv_tokens_predicted", predicted_tokens)
    reported = getattr(rep, "kv_cache_tokens", None)
    if predicted_tokens and reported is not None:
        rec.metric("capacity_error_pct", (reported - predicted_tokens) / predicted_tokens * 100.0)
    for key, value in kv_figures(out).items():
        rec.metric(key, value)
    for step, seconds in out.step_s.items():
        rec.metric(f"step_{step}_s", seconds)
    _latency_metrics(rec, out)
    _sweep_metrics(rec, out.sweep)
    _eval_metrics(rec, out, baseline_accuracy)
    if out.kl is not None and hasattr(out.kl, "metrics"):
        for k, v in out.kl.metrics().items():
            rec.metric(k, v)
    rec.tag("quantrack.derived_metrics", "kv_tokens_predicted,capacity_error_pct,kv_mib_predicted,kv_mib_error_pct,"
                                         "tpot_vs_server_pct,gsm8k_delta_vs_baseline")
    # artifacts
    if out.launch_argv:
        rec.artifacts["launch/command.txt"] = " ".join(redact_argv(out.launch_argv, rec.secrets)) + "\n"
        rec.artifacts["launch/env.json"] = json.dumps(redact_env(out.launch_env), indent=1, sort_keys=True)
    if out.server_log is not None and Path(out.server_log).is_file():
        rec.artifact_files[f"server/{Path(out.server_log).name}"] = str(out.server_log)
    if rep is not None:
        rec.artifacts["server/log_report.json"] = json.dumps(rep.to_dict(), indent=1, default=str)
    if out.live:
        rec.artifacts["server/live.json"] = json.dumps(out.live, indent=1, default=str)
    if out.latency is not None and hasattr(out.latency, "to_row"):
        rec.artifacts["latency/latency.json"] = json.dumps(out.latency.to_row(), indent=1, default=str)
    elif out.latency_row is not None:
        rec.artifacts["latency/latency.json"] = json.dumps(out.latency_row, indent=1, default=str)
    if out.sweep is not None:
        data = out.sweep.to_dict() if hasattr(out.sweep, "to_dict") else out.sweep
        rec.artifacts["sweep/sweep.json"] = json.dumps(data, indent=1, default=str)
    if out.eval is not None:
        data = out.eval.to_dict() if hasattr(out.eval, "to_dict") else out.eval
        rec.artifacts["eval/result.json"] = json.dumps(data, indent=1, default=str)
    if out.eval_records is not None and Path(out.eval_records).is_file():
        rec.artifact_files["eval/records.jsonl"] = str(out.eval_records)
    if out.kl is not None and hasattr(out.kl, "to_dict"):
        rec.artifacts["kl/result.json"] = json.dumps(out.kl.to_dict(), indent=1, default=str)
    for rel, png in out.plots.items():
        if Path(png).is_file():
            rec.artifact_files[rel] = str(png)
    if out.verdicts:
        rec.artifacts["preflight/verdicts.json"] = json.dumps(
            [v.to_dict() if hasattr(v, "to_dict") else v for v in out.verdicts], indent=1, default=str)
    rec.status = out.status if out.status != "RUNNING" else "FAILED"
    rec.end_ms = int(time.time() * 1000)
    return rec


def _effective_kv(arm: Arm, rep: Any) -> str | None:
    """The KV dtype the engine stored, from its log: 'auto' resolves to the log's activation dtype."""
    if rep is None:
        return None
    kv, dtype = getattr(rep, "kv_cache_dtype", None), getattr(rep, "dtype", None)
    if kv and kv != "auto":
        return str(kv)
    return str(dtype) if kv == "auto" and dtype else None


def _latency_metrics(rec: RunRecord, out: ArmOutcome) -> None:
    lat = out.latency
    if lat is not None and hasattr(lat, "stats"):
        st = lat.stats()
        for key, s in st.items():
            if s is None:
                continue
            if key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "server_tpot_ms"):
                rec.metric(f"{key}_p50", s.median)
                rec.metric(f"{key}_mean", s.mean)
            if key in ("itl_ms", "ttft_ms", "tpot_ms"):
                rec.metric(f"{key}_p90", s.p90)
                rec.metric(f"{key}_p99", s.p99)
            if key in ("tpot_ms", "ttft_ms") and s.ci95_low is not None:
                rec.metric(f"{key}_ci_low", s.ci95_low)
                rec.metric(f"{key}_ci_high", s.ci95_high)
            if key == "decode_tok_s":
                rec.metric("decode_tok_s_p50", s.median)
        ok = lat.ok_samples
        rec.metric("latency_n_ok", len(ok))
        rec.metric("latency_n_failed", lat.n_failed)
        rec.metric("server_tpot_ms", st["server_tpot_ms"].median if st.get("server_tpot_ms") else None)
        rec.metric("tpot_vs_server_pct", lat.tpot_vs_server_median_pct())
        rec.series("sample_tpot_ms", [s.tpot * 1000 for s in ok if s.tpot is not None])
        rec.series("sample_ttft_ms", [s.ttft * 1000 for s in ok if s.ttft is not None])
        return
    row = out.latency_row
    if row is None:
        return
    for key, name in (("ttft_ms", "ttft_ms"), ("tpot_ms", "tpot_ms"), ("itl_ms", "itl_ms"), ("e2e_ms", "e2e_ms"),
                      ("server_tpot_ms", "server_tpot_ms")):
        s = row.get(key)
        if isinstance(s, dict):
            rec.metric(f"{name}_p50", s.get("median"))
            rec.metric(f"{name}_mean", s.get("mean"))
            if key in ("itl_ms", "ttft_ms", "tpot_ms"):
                rec.metric(f"{name}_p90", s.get("p90"))
                rec.metric(f"{name}_p99", s.get("p99"))
            if key in ("tpot_ms", "ttft_ms"):
                rec.metric(f"{name}_ci_low", s.get("ci95_low"))
                rec.metric(f"{name}_ci_high", s.get("ci95_high"))
    if isinstance(row.get("server_tpot_ms"), dict):
        rec.metric("server_tpot_ms", row["server_tpot_ms"].get("median"))
    rec.metric("latency_n_ok", row.get("n_ok"))
    rec.metric("latency_n_failed", row.get("n_failed"))
    samples = row.get("samples") or []
    rec.series("sample_tpot_ms", [s["tpot_ms"] for s in samples if isinstance(s, dict) and s.get("ok", True)
                                  and isinstance(s.get("tpot_ms"), (int, float))])
    # the lab's reference client (the lab reference client latency.py): medians over its measured batch-1 requests,
    # and per concurrency level the median TPOT/TTFT and the output tokens/s of the level
    b1 = row.get("batch1")
    if isinstance(b1, dict):
        rec.metric("ttft_ms_p50", b1.get("ttft_ms"))
        rec.metric("tpot_ms_p50", b1.get("tpot_ms"))
        rec.metric("e2e_ms_p50", b1.get("e2e_ms"))
        if isinstance(b1.get("tokens"), list):
            rec.metric("latency_n_ok", len(b1["tokens"]))
    for key, val in row.items():
        if key.startswith("conc") and key[4:].isdigit() and isinstance(val, dict):
            c = int(key[4:])
            rec.metric(f"sweep_output_tps_c{c}", val.get("out_tok_per_s"))
            rec.metric(f"sweep_tpot_ms_p50_c{c}", val.get("tpot_ms"))
            rec.metric(f"sweep_ttft_ms_p50_c{c}", val.get("ttft_ms"))


def _sweep_metrics(rec: RunRecord, sweep: Any) -> None:
    if sweep is None:
        return
    # quantrack.measure.sweep.SweepResult.rows: one dict per level (concurrency, output_tok_s, request_s, ...)
    levels = getattr(sweep, "rows", None) or (sweep.get("rows") if isinstance(sweep, dict) else None) or []
    for lv in levels:
        c = _num(lv, "concurrency")
        if c is None:
            continue
        ci = int(c)
        rec.metric(f"sweep_output_tps_c{ci}", _num(lv, "output_tok_s"))
        rec.metric(f"sweep_tpot_ms_p50_c{ci}", _num(lv, "tpot_p50_ms"))
        rec.metric(f"sweep_ttft_ms_p50_c{ci}", _num(lv, "ttft_p50_ms"))
        rec.metric(f"sweep_request_tps_c{ci}", _num(lv, "request_s"))


def _eval_metrics(rec: RunRecord, out: ArmOutcome, baseline_accuracy: float | None) -> None:
    ev = out.eval
    if ev is None:
        return
    acc = _num(ev, "accuracy")
    rec.metric("gsm8k_accuracy", acc)
    rec.metric("gsm8k_se", _num(ev, "se"))
    rec.metric("gsm8k_ci_low", _num(ev, "ci_low"))
    rec.metric("gsm8k_ci_high", _num(ev, "ci_high"))
    rec.metric("gsm8k_n", _num(ev, "n"))
    rec.metric("gsm8k_correct", _num(ev, "correct"))
    rec.metric("gsm8k_invalid", _num(ev, "invalid"))
    rec.metric("gsm8k_errors", _num(ev, "errors"))
    source = ev.get("source") if isinstance(ev, dict) else getattr(ev, "source", None)
    rec.tag("quantrack.gsm8k_source", source)
    if acc is not None and baseline_accuracy is not None and not out.arm.baseline:
        rec.metric("gsm8k_delta_vs_baseline", acc - baseline_accuracy)
    bitmap, sha = outcomes_bitmap(out.eval_records)
    rec.tag("quantrack.gsm8k_correct", bitmap)
    settings = ev.get("settings") if isinstance(ev, dict) else getattr(ev, "settings", None)
    rec.tag("quantrack.gsm8k_data_sha256", sha or (settings or {}).get("data_sha256"))


def study_record(study: Study, experiment: str, node: dict[str, Any]) -> RunRecord:
    rec = RunRecord(experiment=experiment, run_name=f"study:{study.name}", status="RUNNING")
    rec.secrets = secret_values(dict(study.engine.env))
    for k, v in provenance_tags().items():
        rec.tag(k, v)
    rec.tag("quantrack.role", "study")
    rec.tag("quantrack.study", study.name)
    rec.param("study", study.name)
    rec.param("engine", study.engine.kind)
    rec.param("engine_version", study.engine.version)
    rec.param("model", study.model.path or study.model.gguf or study.model.name)
    rec.param("gpu_catalog", study.gpu.name)
    rec.param("gpu_name", node.get("gpu_name"))
    rec.param("hostname", node.get("hostname"))
    rec.param("arms", ",".join(a.name for a in study.arms))
    rec.param("baseline", study.baseline.name)
    rec.param("max_model_len", study.context_len)
    if study.source and Path(study.source).is_file():
        rec.artifact_files["study/study.toml"] = study.source
    return rec
