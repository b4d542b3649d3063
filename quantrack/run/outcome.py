"""What one arm of a study produced (``ArmOutcome``), the run options and the study's result.

Steps write into the outcome as they finish, so whatever ends the arm (a failure, an interrupt, a signal),
the outcome holds every figure measured up to then."""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantrack.arms import Arm
from quantrack.errors import QuantrackError
from quantrack.run.schema import STATUS_FAILED
from quantrack.store.records import Logged
from quantrack.study import Study

if TYPE_CHECKING:
    from quantrack.accuracy.gsm8k import EvalResult
    from quantrack.accuracy.kl import KLResult
    from quantrack.engines.base import LiveFacts, LogReport
    from quantrack.hardware.capacity import ArmPrediction
    from quantrack.hardware.rulebook import Verdict
    from quantrack.measure.hygiene import Hygiene
    from quantrack.measure.latency import LatencyResult
    from quantrack.measure.sweep import SweepResult
    from quantrack.models.weights import WeightsProvenance

Progress = Callable[[str], None]



class StepError(QuantrackError):
    """One step of one arm failed; the arm is logged FAILED with what it measured so far."""

    exit_code = 1


@dataclass
class ArmOutcome:
    """Everything one arm produced (any field may be None: not measured)."""

    arm: Arm
    status: str = "RUNNING"
    verdict: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    predicted: ArmPrediction | None = None  # quantrack.hardware.capacity.predict_for_arm (derived)
    launch_argv: list[str] | None = None
    launch_env: dict[str, str] = field(default_factory=dict)
    server_log: Path | None = None
    base_url: str | None = None
    log_report: LogReport | None = None
    live: LiveFacts | None = None  # adapter.query (measured)
    latency: LatencyResult | None = None
    latency_row: dict[str, Any] | None = None  # an imported latency row (quantrack log)
    sweep: SweepResult | None = None
    eval: EvalResult | None = None
    eval_records: Path | None = None
    kl: KLResult | None = None  # against the baseline arm
    model_ref: str | None = None  # the study's model reference (smollm2:Q8_0) the file was resolved from
    weights: WeightsProvenance | None = None  # the SHA-256 of the weight files loaded (quantrack.models.weights)
    plots: dict[str, Path] = field(default_factory=dict)  # artifact path -> local PNG
    node: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    failed_step: str | None = None  # the step the arm was in when it failed or was interrupted
    step: str | None = None  # the step in progress (None between steps)
    steps: list[str] = field(default_factory=list)  # steps that completed
    step_s: dict[str, float] = field(default_factory=dict)  # wall seconds per completed step (measured)
    engine_pid: int | None = None  # the engine's process (its tree is the engine in the host-load figures)
    hygiene: dict[str, Hygiene] = field(default_factory=dict)  # step -> host/GPU contention while it ran
    start_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    source: str = "run"  # run | log
    # the arm's run id (quantrack.run_uuid): the same for its step checkpoints, a forced exit's spool entry and the
    # logged run, so `sync` uploads it once whichever of them reaches the store
    run_uuid: str = field(default_factory=lambda: uuidlib.uuid4().hex)
    # called after each finished step (the study's checkpoint of the arm to the spool); never fails the arm
    on_step: Callable[[], None] | None = field(default=None, repr=False)
    # set by the serve step: the exit status of the engine process quantrack started, None while it runs
    engine_exit: Callable[[], int | None] | None = field(default=None, repr=False)


@dataclass
class RunOptions:
    arm: str | tuple[str, ...] | None = None  # one arm name or several (`--arm` is repeatable); None: all
    base_url: str | None = None
    server_log: str | None = None
    tracking_uri: str | None = None
    api_key: str | None = None  # for the engine's OpenAI API; never logged
    prices: str | None = None  # --prices FILE for the closing compare table's cost column (None: shipped prices)
    workdir: Path | None = None  # server logs and eval records go here


@dataclass
class StudyResult:
    study: Study
    experiment: str
    outcomes: list[ArmOutcome]
    parent: Logged | None
    logged: dict[str, Logged]
    table: str | None = None  # the compare table of this study's arm runs (rendered)
    decision: list[str] = field(default_factory=list)  # the decision page's recommendation, in plain lines
    plots: list[Path] = field(default_factory=list)
    wall_s: float | None = None

    @property
    def failed(self) -> list[str]:
        return [o.arm.name for o in self.outcomes if o.status == STATUS_FAILED]
