"""Names that become file names: a study's name (its work folder, exported files), an arm's name (server logs,
eval records, plots), an experiment's name (the store, the report's files).

A name that is a path (``../x``, ``/some/dir``, ``f/16``), holds a NUL or a control character, or is ``.``/``..``
is refused where it is given (one line, exit 2); a name read back from a store, which quantrack did not
validate, is made safe with :func:`file_part` before it is joined to a folder. Lengths are capped where they are
given, so a 5,000-character name fails up front, not when a store refuses it.
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


def file_part(name: str, limit: int = 100) -> str:
    """Any name as a safe single file-name part: separators, NUL and control characters become ``_``, a
    leading dot is dropped (no ``..``, no hidden file), long names are cut."""
    safe = _BAD.sub("_", name).lstrip(".").strip() or "_"
    return safe[:limit]
