"""``quantrack log``: results measured elsewhere recorded as one arm run (no parent)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantrack.accuracy.gsm8k import EvalResult
from quantrack.errors import BadInput
from quantrack.run.orchestrate import stored_baseline_accuracy
from quantrack.run.outcome import ArmOutcome, Progress
from quantrack.run.record import record_for_arm
from quantrack.run.steps import check_server_log, step_predict
from quantrack.store.records import Logged, RunRecord
from quantrack.store.tracking import Tracker
from quantrack.study import Study


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
    except UnicodeDecodeError:
        raise BadInput(f"{what} {str(path)!r}: not a text file") from None


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


def load_eval(path: Path) -> tuple[EvalResult, Path | None]:
    """--eval: quantrack's per-question records (.jsonl, with their .meta.json), or any file
    ``quantrack eval import`` reads (quantrack's result JSON, vLLM gsm8k_eval --save-results, SGLang run_eval,
    lm-eval results/samples) through the one importer, ``quantrack.accuracy.importers``: the same file logs
    the same metrics through either command. Returns (result, quantrack records file or None)."""
    from quantrack.accuracy import importers

    if not path.is_file():
        raise BadInput(f"--eval {str(path)!r}: no such file")
    try:
        if path.suffix == ".jsonl" and not _is_lm_eval_samples(path):
            return _from_records(path), path
        result, _records = importers.load_run(path)
    except UnicodeDecodeError:
        raise BadInput(f"--eval {str(path)!r}: not a text file") from None
    except BadInput as exc:
        raise BadInput(f"--eval {exc}") from None
    return result, None


def _is_lm_eval_samples(path: Path) -> bool:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                return '"doc_id"' in line
    return False


def _from_records(path: Path) -> EvalResult:
    from quantrack.accuracy.gsm8k import result_from_records
    from quantrack.accuracy.records import load_records, read_meta

    recs = load_records(path)
    if not recs:
        raise BadInput(f"{str(path)!r}: no records")
    meta = read_meta(path) or {}
    n_q = int(meta.get("num_questions") or (max(recs) + 1))
    return result_from_records(recs, num_questions=n_q, style=meta.get("style"), records_path=str(path),
                               source="imported:records", settings=meta)


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
    out = ArmOutcome(arm=arm, node={}, source="log", status="FINISHED")
    if inputs.latency:
        out.latency_row = load_latency_row(inputs.latency)
    if inputs.eval:
        out.eval, out.eval_records = load_eval(inputs.eval)
    if inputs.server_log:
        check_server_log(inputs.server_log, study.engine.kind)
        from quantrack.engines import get_adapter

        out.log_report = get_adapter(study.engine.kind).parse_log_file(inputs.server_log)
        out.server_log = inputs.server_log
    with contextlib.suppress(Exception):
        out.predicted = step_predict(study, arm, {})
    experiment = study.tracking.experiment or study.name
    tracker = Tracker(inputs.tracking_uri or study.tracking.uri, experiment, progress=progress)
    baseline_acc = None if arm.baseline else stored_baseline_accuracy(study, tracker)
    rec = record_for_arm(study, out, experiment=experiment, baseline_accuracy=baseline_acc)
    return rec, tracker.log(rec)
