"""Errors whose message is meant for the user.

The CLI turns every ``QuantrackError`` into one line on stderr and its ``exit_code``
(2 = bad input). Anything else escaping a command is a bug.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class QuantrackError(Exception):
    """Base class: ``str(err)`` is shown to the user as one line."""

    exit_code = 2


class BadInput(QuantrackError):
    """The user gave a flag, file or value quantrack cannot use."""


class NotFound(BadInput):
    """A named thing (GPU, model, rule, method, run ...) is unknown."""


class EngineError(QuantrackError):
    """An engine process failed to start, died, or answered nonsense."""

    exit_code = 1


class MeasurementError(QuantrackError):
    """A measurement could not be completed (the partial result is kept elsewhere)."""

    exit_code = 1


class EnvironmentMissing(QuantrackError):
    """Something the command needs on this machine is absent (driver, CUDA, package)."""

    exit_code = 2


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    pool = list(choices)
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean {lowered[close[0]]!r}?)" if close else ""


def unknown(kind: str, name: str, choices: Iterable[str], list_command: str | None = None) -> NotFound:
    """Build the standard 'unknown X' error: did-you-mean plus where to see the list."""
    msg = f"unknown {kind} {name!r}{did_you_mean(name, choices)}"
    if list_command:
        msg += f"; see `{list_command}`"
    return NotFound(msg)
