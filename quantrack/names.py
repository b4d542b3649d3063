"""Names that become file names: a study's name (its work folder, exported files), an arm's name (server logs,
eval records, plots), an experiment's name (the store, the report's files).

A name that is a path (``../x``, ``/some/dir``, ``f/16``), holds a NUL or a control character, or is ``.``/``..``
is refused where it is given (one line, exit 2): the study file, ``make_arm`` (the notebook API, ``log --arm``).
Lengths are capped where they are given, so a 5,000-character name fails up front, not when a store refuses it.
"""

from __future__ import annotations

import re

from quantrack.errors import BadInput

MAX_NAME = 200  # study and arm names (an MLflow run name; a file name part)
MAX_EXPERIMENT = 250  # MLflow's experiments.name column is VARCHAR(256) on PostgreSQL / MySQL
_BAD = re.compile(r"[/\\\x00-\x1f\x7f]")


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
                       "(no '/', '\\', NUL or control characters, not '.' or '..')")
    return name

