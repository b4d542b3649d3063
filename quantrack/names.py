"""Names that become file names: a study's name (its work folder, exported files), an arm's name (server logs,
eval records, plots), an experiment's name (the store, the report's files).

A name that is a path (``../x``, ``/some/dir``, ``f/16``), holds a NUL, a control character, a bidirectional
override or a zero-width character (a name that prints as another), or is ``.``/``..``
is refused where it is given (one line, exit 2): the study file, ``make_arm`` (the notebook API, ``log --arm``).
Lengths are capped where they are given, so a 5,000-character name fails up front, not when a store refuses it.
"""

from __future__ import annotations

import re

from quantrack.errors import BadInput

MAX_NAME = 200  # study and arm names (an MLflow run name; a file name part)
MAX_EXPERIMENT = 250  # MLflow's experiments.name column is VARCHAR(256) on PostgreSQL / MySQL
# C0/C1 controls, DEL, and what shows a name other than it is: bidirectional overrides, embeddings and isolates
# (U+202A-U+202E, U+2066-U+2069, the marks U+200E/U+200F/U+061C: '\u202e' turns 'fp8-kv' around on screen) and
# zero-width characters (U+200B-U+200D, U+2060, U+FEFF: two names that print the same)
_BAD = re.compile("[/\\\\\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]")


def check_name(name: object, what: str, limit: int = MAX_NAME) -> str:
    """``name`` if it can be part of a file name; else one-line BadInput naming ``what``."""
    if not isinstance(name, str) or not name.strip():
        raise BadInput(f"{what}: expected a non-empty string")
    if len(name) > limit:
        raise BadInput(f"{what}: {len(name)} characters ({name[:24]!r}…); at most {limit}")
    bad = _BAD.search(name)
    if bad or name.strip() in (".", ".."):
        shown = repr(bad.group()) if bad else repr(name.strip())
        raise BadInput(f"{what} {name[:60]!r}: a name becomes a file name, so it may not hold {shown} "
                       "(no '/', '\\', NUL, control, bidirectional or zero-width characters, not '.' or '..')")
    return name



_BAD_EXPERIMENT = re.compile(_BAD.pattern.replace("/", "", 1))


def check_experiment(name: object, what: str = "[tracking] experiment") -> str:
    """An MLflow experiment name: not a file name here (a report's default page name is sanitised), but shown and
    stored. A '/' is allowed (Databricks experiments are workspace paths, ``/Users/me/exp``); a ``..`` segment,
    ``\\``, NUL, control, bidirectional or zero-width characters are not (``../../x`` reads as a path out of the
    store; ``\\u202e`` shows another name). Over MAX_EXPERIMENT characters is refused too. One line, exit 2."""
    if not isinstance(name, str) or not name.strip():
        raise BadInput(f"{what}: expected a non-empty string")
    if len(name) > MAX_EXPERIMENT:
        raise BadInput(f"{what}: {len(name)} characters ({name[:24]!r}…); at most {MAX_EXPERIMENT}")
    bad = _BAD_EXPERIMENT.search(name)
    if bad:
        raise BadInput(f"{what} {name[:60]!r}: may not hold {bad.group()!r} (no '\\', NUL, control, bidirectional or "
                       "zero-width characters)")
    if any(part.strip() in (".", "..") for part in name.split("/")):
        raise BadInput(f"{what} {name[:60]!r}: a '.' or '..' segment is a path, not a name")
    return name


def shown_name(name: str, limit: int = 60) -> str:
    """A name as an error line prints it: itself when it is clean, else escaped (``'fp8\\u202ekv'``), so a
    right-to-left override in a refused name cannot turn the rest of the line around on the terminal."""
    name = name[:limit]
    return name if not _BAD.search(name) else ascii(name)
