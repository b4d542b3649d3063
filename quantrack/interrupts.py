"""Interrupts and termination signals as one exception, ``Interrupted`` (a ``KeyboardInterrupt``).

Ctrl-C (SIGINT), SIGTERM and SIGHUP all unwind the stack the same way while ``signals_raise()`` is active,
so every ``finally`` and context manager runs: the arm in progress is logged KILLED with what it measured,
the engine is stopped, the parent run is closed. The exit status is 128 + the signal number (130, 143, 129).

A measurement that is interrupted re-raises with what it had measured attached (``partial``): it never
swallows the interrupt and returns as if it had finished.

A second signal while the first is being handled calls the ``force`` callback given to
``signals_raise`` (spool what is held, kill the engines) and exits at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """An interrupt (SIGINT) or a termination signal; ``partial``: what the interrupted measurement had."""

    def __init__(self, signum: int = signal.SIGINT, partial: Any = None) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum
        self.partial = partial

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def reason(self) -> str:
        return "interrupted (SIGINT)" if self.signum == signal.SIGINT else f"terminated ({signal_name(self.signum)})"

    @classmethod
    def of(cls, exc: BaseException, partial: Any = None) -> Interrupted:
        """``exc`` (a KeyboardInterrupt or an Interrupted) as an Interrupted carrying ``partial``."""
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        return cls(signum, partial)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def as_interrupted(exc: BaseException) -> Interrupted:
    return exc if isinstance(exc, Interrupted) else Interrupted.of(exc)


@contextlib.contextmanager
def signals_raise(force: Callable[[int], None] | None = None) -> Iterator[None]:
    """Within the block, SIGINT / SIGTERM / SIGHUP raise ``Interrupted`` in the main thread (once); a second
    one calls ``force(signum)`` and exits with 128 + signum. Outside the main thread it does nothing (Python
    delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not first:
            first.append(signum)
            raise Interrupted(signum)
        if force is not None:
            with contextlib.suppress(BaseException):  # forcing the exit: nothing may stop it now
                force(signum)
        os._exit(128 + first[0])

    previous = {s: signal.signal(s, handler) for s in HANDLED}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
