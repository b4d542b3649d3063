"""``quantrack log``: results measured elsewhere recorded as one arm run (no parent)."""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.errors import BadInput
from quantrack.run.orchestrate import _stored_baseline_accuracy
from quantrack.run.outcome import ArmOutcome, Progress
from quantrack.run.record import record_for_arm
from quantrack.run.steps import step_predict
from quantrack.study import Study
from quantrack.tracking import Logged, RunRecord, Tracker


@dataclass
class LogInputs:
    study: Study
    arm: str
    latency: Path | None = None
    eval: Path | None = None
    server_log: Path | None = None
    engine: str | None = None
    tracking_uri: str | None = None


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"{what} {str(path)!r}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{what} {str(path)!r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def load_latency_row(path: Path) -> dict[str, Any]:
    """A saved latency row: quantrack's own (format quantrack-latency/1) or the lab's reference client output
    (label/input/output/batch1/concN, medians; the lab reference client latency.py)."""
    data = _read_json(path, "--latency")
    if not isinstance(data, dict):
        raise BadInput(f"--latency {str(path)!r}: expected a JSON object")
    if data.get("format", "").startswith("quantrack-latency/") or "batch1" in data:
        return data
    raise BadInput(f"--latency {str(path)!r}: not a latency row (expected quantrack's `latency --output` JSON, "
                   "or the reference client's batch1/concN JSON)")


def load_eval(path: Path) -> tuple[Any, Path | None]:
    """--eval: per-question records (.jsonl) or a result JSON (quantrack's EvalResult dict, or vLLM's
    gsm8k_eval --save-results with accuracy + num_questions)."""
    if path.suffix == ".jsonl":
        from quantrack.accuracy.gsm8k import result_from_records
        from quantrack.accuracy.records import load_records, read_meta

        recs = load_records(path)
        if not recs:
            raise BadInput(f"--eval {str(path)!r}: no records")
        meta = read_meta(path) or {}
        n_q = int(meta.get("num_questions") or (max(recs) + 1))
        return result_from_records(recs, num_questions=n_q, style=meta.get("style"), records_path=str(path),
                                   source="imported:records", settings=meta), path
    data = _read_json(path, "--eval")
    if not isinstance(data, dict):
        raise BadInput(f"--eval {str(path)!r}: expected a JSON object")
    acc = data.get("accuracy")
    if not isinstance(acc, (int, float)) or isinstance(acc, bool):
        raise BadInput(f"--eval {str(path)!r}: no numeric 'accuracy' (pass records .jsonl or a result JSON)")
    if "n" in data and "correct" in data:
        return dict(data), None
    n = data.get("num_questions")
    if not isinstance(n, int) or n < 1:
        raise BadInput(f"--eval {str(path)!r}: has 'accuracy' but no 'num_questions': the standard error "
                       "cannot be derived")
    se = math.sqrt(acc * (1 - acc) / n)
    return {"task": "gsm8k", "accuracy": float(acc), "n": n, "se": se, "source": "imported:vllm-gsm8k_eval",
            "settings": {k: data.get(k) for k in ("num_shots", "max_tokens") if k in data}}, None


def log_results(inputs: LogInputs, progress: Progress | None = None) -> tuple[RunRecord, Logged]:
    """Record results measured elsewhere as one arm run (no parent)."""
    study = inputs.study
    arm = study.arm(inputs.arm)
    if inputs.engine and inputs.engine != study.engine.kind:
        from dataclasses import replace

        from quantrack.study import ENGINES

        if inputs.engine not in ENGINES:
            from quantrack.errors import unknown

            raise unknown("engine", inputs.engine, ENGINES)
        study = replace(study, engine=replace(study.engine, kind=inputs.engine))
    if not (inputs.latency or inputs.eval or inputs.server_log):
        raise BadInput("nothing to log: pass --latency, --eval and/or --server-log")
    out = ArmOutcome(arm=arm, node={"hostname": None}, source="log", status="FINISHED")
    out.node = {}
    if inputs.latency:
        out.latency_row = load_latency_row(inputs.latency)
    if inputs.eval:
        out.eval, out.eval_records = load_eval(inputs.eval)
    if inputs.server_log:
        if not inputs.server_log.is_file():
            raise BadInput(f"--server-log {str(inputs.server_log)!r}: no such file")
        from quantrack.engines import get_adapter

        out.log_report = get_adapter(study.engine.kind).parse_log_file(inputs.server_log)
        out.server_log = inputs.server_log
    with contextlib.suppress(Exception):
        out.predicted = step_predict(study, arm, {})
    experiment = study.tracking.experiment or study.name
    tracker = Tracker(inputs.tracking_uri or study.tracking.uri, experiment, progress=progress)
    baseline_acc = None if arm.baseline else _stored_baseline_accuracy(study, tracker)
    rec = record_for_arm(study, out, experiment=experiment, baseline_accuracy=baseline_acc)
    return rec, tracker.log(rec)
