"""Interrupts and termination signals as one exception, ``Interrupted`` (a ``KeyboardInterrupt``).

Ctrl-C (SIGINT), SIGTERM and SIGHUP all unwind the stack the same way while ``signals_raise()`` is active,
so every ``finally`` and context manager runs: the arm in progress is logged KILLED with what it measured,
the engine is stopped, the parent run is closed. The exit status is 128 + the signal number (130, 143, 129).

A measurement that is interrupted re-raises with what it had measured attached (``partial``): it never
swallows the interrupt and returns as if it had finished.

A second signal while the first is being handled calls the ``force`` callback given to
``signals_raise`` (spool what is held, kill the engines) and exits at once. Further signals are ignored from
that moment (a third Ctrl-C must not re-enter ``force`` half-way through its spool write), and what ``force``
did is said only after it did it, written straight to file descriptor 2 (a signal handler must not re-enter
the Python stream the interrupted code may be writing to).
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
def signals_raise(force: Callable[[int], list[str] | None] | None = None) -> Iterator[None]:
    """Within the block, SIGINT / SIGTERM / SIGHUP raise ``Interrupted`` in the main thread (once); a second
    one calls ``force(signum)`` and exits with 128 + the first signal. ``force`` returns the lines that say
    what it did (written to stderr after it returns). Outside the main thread it does nothing (Python
    delivers signals to the main thread only).

    When the block is left by an interrupt in a process that ends on it (``exit_on_late_signals``, the CLI),
    a later signal exits at once with the same status instead of dying of the default handler half-way
    through the exit (every record is logged or spooled by then)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not first:
            first.append(signum)
            raise Interrupted(signum)
        for s in HANDLED:  # nothing re-enters the forced exit
            with contextlib.suppress(BaseException):
                signal.signal(s, signal.SIG_IGN)
        lines: list[str] = []
        if force is not None:
            try:
                lines = list(force(signum) or [])
            except BaseException as exc:  # noqa: BLE001 - forcing the exit: nothing may stop it now
                lines = [(f"{signal_name(signum)} again: the forced exit failed before it finished "
                          f"({type(exc).__name__}: {str(exc)[:300]})")]
        _say_raw(lines)
        os._exit(128 + first[0])

    previous = {s: signal.signal(s, handler) for s in HANDLED}
    try:
        yield
    finally:
        late = first and _EXIT_ON_LATE_SIGNALS
        for s, h in previous.items():
            signal.signal(s, _exit_now(128 + first[0]) if late else h)
        if late:
            global _ENDED_BY_SIGNAL
            _ENDED_BY_SIGNAL = True


_EXIT_ON_LATE_SIGNALS = False
_ENDED_BY_SIGNAL = False


def ignore_signals_at_exit() -> None:
    """The last call of a CLI process that an interrupt ended: Python's finalization puts the default handler back
    on every signal that has a Python handler (``_exit_now`` included), so a late Ctrl-C during the interpreter's
    shutdown killed the process (status -2) after everything was logged. Ignored signals stay ignored through it,
    and the exit status stays 128 + the first signal. A no-op unless ``signals_raise`` was left by an interrupt."""
    if _ENDED_BY_SIGNAL:
        for s in HANDLED:
            with contextlib.suppress(BaseException):
                signal.signal(s, signal.SIG_IGN)


def exit_on_late_signals(on: bool = True) -> None:
    """This process ends when an interrupt ends its work (the CLI): see ``signals_raise``."""
    global _EXIT_ON_LATE_SIGNALS
    _EXIT_ON_LATE_SIGNALS = on


def _exit_now(code: int) -> Callable[[int, Any], None]:
    def handler(signum: int, _frame: Any) -> None:
        _say_raw([(f"{signal_name(signum)} while exiting: exiting now (everything was logged or spooled "
                   "already)")])
        os._exit(code)
    return handler


def _say_raw(lines: list[str]) -> None:
    """Lines to file descriptor 2, bypassing Python's streams (safe inside a signal handler)."""
    for line in lines:
        with contextlib.suppress(OSError):
            os.write(2, f"quantrack: {line}\n".encode("utf-8", "replace"))
