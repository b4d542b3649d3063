"""The rule that fails a measured step (docs/tracking.md "Run status"): more than half of its samples failed,
or the engine process quantrack started exited during the arm. The real case (a llama.cpp server SIGKILLed
mid-stream) is tests/integration/test_faults_real.py::test_engine_killed_mid_stream_arm_is_failed."""

from __future__ import annotations

import pytest

from quantrack.arms import make_arm
from quantrack.run.orchestrate import _check_measured
from quantrack.run.outcome import ArmOutcome, StepError


def _out(rc: int | None = None, serving: bool = False) -> ArmOutcome:
    out = ArmOutcome(arm=make_arm("q8_0", weights="q8_0"))
    if serving:
        out.engine_exit = lambda: rc
    return out


@pytest.mark.parametrize(("failed", "total"), [(0, 20), (1, 20), (10, 20), (1, 2)])
def test_half_or_fewer_failed_passes(failed: int, total: int) -> None:
    _check_measured(_out(), "latency", failed, total, "latency samples")  # no raise


@pytest.mark.parametrize(("failed", "total"), [(11, 20), (19, 20), (20, 20), (1, 1)])
def test_more_than_half_failed_fails_the_step(failed: int, total: int) -> None:
    with pytest.raises(StepError, match=rf"^latency: {failed} of {total} latency samples failed"):
        _check_measured(_out(), "latency", failed, total, "latency samples")


def test_engine_exited_fails_the_arm_even_with_every_sample_ok() -> None:
    _check_measured(_out(rc=None, serving=True), "sweep", 0, 8, "sweep requests")  # still running
    with pytest.raises(StepError, match=r"^sweep: the engine process exited during the arm \(exit status -9\)"):
        _check_measured(_out(rc=-9, serving=True), "sweep", 0, 8, "sweep requests")
