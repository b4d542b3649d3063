"""Compatibility facade for scripts outside the package (bench/, notebooks, older tests): ``quantrack run`` lives
in the ``quantrack.run`` package, split by job (docs/architecture.md). Nothing inside ``quantrack`` imports this
module (a test checks it); the names below keep ``from quantrack.runner import ...`` working."""

from __future__ import annotations

from quantrack.run.imported import LogInputs, load_eval, load_latency_row, log_results
from quantrack.run.orchestrate import run_arm, run_study, study_table
from quantrack.run.outcome import (
    ArmOutcome,
    RunOptions,
    StepError,
    StudyResult,
)
from quantrack.run.record import outcomes_bitmap, record_for_arm, study_record
from quantrack.run.schema import STATUS_REJECTED
from quantrack.run.steps import local_node, step_kl, step_predict, step_serve

__all__ = [
    "STATUS_REJECTED",
    "ArmOutcome",
    "LogInputs",
    "RunOptions",
    "StepError",
    "StudyResult",
    "load_eval",
    "load_latency_row",
    "local_node",
    "log_results",
    "outcomes_bitmap",
    "record_for_arm",
    "run_arm",
    "run_study",
    "step_kl",
    "step_predict",
    "step_serve",
    "study_record",
    "study_table",
]
