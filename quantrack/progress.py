"""Progress for long steps: counts, rate and time left, so that no step is silent for more than ~10 s.

On a terminal (stderr is a TTY) each phase gets a ``tqdm`` bar; otherwise (CI, a log file, a pipe) a plain line
goes through the caller's ``say`` at most every ``interval`` seconds and at the end of each phase. The
measurement functions report progress through plain callbacks — ``(phase, done, total)`` for latency and the
sweep, ``(done, total, errors)`` for GSM8K — and know nothing of how it is shown.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

Say = Callable[[str], None]


def _eta(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


class StepProgress:
    """One step's progress (``latency``, ``sweep``, ``gsm8k``…) for one arm."""

    def __init__(self, say: Say, label: str, *, stream: IO[str] | None = None, interval: float = 10.0,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.say = say
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self._phase: str | None = None
        self._created: float | None = clock()  # the first phase counts from here (the step started before its first reply)
        self._start = 0.0
        self._last = 0.0
        self._bar: Any = None
        self.lines: int = 0  # plain lines said (for tests and for the step's own summary)

    def _new_phase(self, phase: str, total: int) -> None:
        first = self._created is not None
        self.close()
        self._phase = phase
        self._start = self._last = self._created if first and self._created is not None else self.clock()
        self._created = None
        if self.tty:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(total=total, desc=f"{self.label} {phase}", file=self.stream, leave=False,
                             dynamic_ncols=True, unit="req")

    def __call__(self, phase: str, done: int, total: int, extra: str = "") -> None:
        if phase != self._phase:
            self._new_phase(phase, total)
        if self._bar is not None:
            self._bar.n = done
            if extra:
                self._bar.set_postfix_str(extra, refresh=False)
            self._bar.refresh()
            if done >= total:
                self.close()
            return
        now = self.clock()
        if done < total and now - self._last < self.interval:
            return
        self._last = now
        took = now - self._start
        rate = done / took if took > 0 else 0.0
        left = f", about {_eta((total - done) / rate)} left" if 0 < done < total and rate > 0 else ""
        self.say(f"{self.label} {phase}: {done}/{total} ({rate:.2f}/s{left}){' ' + extra if extra else ''}")
        self.lines += 1

    def gsm8k(self, done: int, total: int, errors: int) -> None:
        """The GSM8K runner's callback shape."""
        self("questions", done, total, f"{errors} errors" if errors else "")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._phase = None
