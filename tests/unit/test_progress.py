"""Progress lines: at most one per interval when not on a terminal, always one at the end of a phase."""

from __future__ import annotations

import io

from quantrack.progress import StepProgress


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_plain_lines_are_rate_limited_and_the_end_is_always_said() -> None:
    said: list[str] = []
    clock = _Clock()
    p = StepProgress(said.append, "[q8_0] latency", tty=False, interval=10.0, clock=clock)
    for i in range(1, 31):
        clock.t = i * 1.0  # one request a second
        p("measure", i, 30)
    # t=10, 20 (interval elapsed) and t=30 (done)
    assert said == ["[q8_0] latency measure: 10/30 (1.00/s, about 20 s left)",
                    "[q8_0] latency measure: 20/30 (1.00/s, about 10 s left)",
                    "[q8_0] latency measure: 30/30 (1.00/s)"]


def test_new_phase_restarts_and_gsm8k_shape() -> None:
    said: list[str] = []
    clock = _Clock()
    p = StepProgress(said.append, "[f16] eval", tty=False, interval=10.0, clock=clock)
    clock.t = 5
    p.gsm8k(10, 10, 2)
    assert said == ["[f16] eval questions: 10/10 (2.00/s) 2 errors"]


def test_tty_uses_a_bar_and_says_nothing() -> None:
    said: list[str] = []
    buf = io.StringIO()
    p = StepProgress(said.append, "[f16] sweep", stream=buf, tty=True)
    for i in range(1, 5):
        p("concurrency 4", i, 4)
    assert said == []
    assert "[f16] sweep concurrency 4" in buf.getvalue() and "4/4" in buf.getvalue()
