"""Files written whole or not at all (the spool, exports, `eval --output`, every command that writes a file),
and the one-line refusals for a path that cannot be written."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from quantrack.errors import BadInput, QuantrackError


class DiskError(QuantrackError):
    """The OS refused to write a file quantrack needed (full disk, read-only, I/O error): one line, the path."""

    exit_code = 1


# --- files: whole or not at all -----------------------------------------------------------------------------

def os_refusal(exc: OSError, path: str | Path, flag: str | None = None) -> QuantrackError:
    """One line for an OS refusal naming the path: BadInput for the user's path, DiskError for the machine."""
    where = f"{flag} {path}" if flag else str(path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskError(f"no space left on device writing {where}")
    if exc.errno in (errno.EIO, errno.EROFS):
        return DiskError(f"cannot write {where}: {exc.strerror}")
    if exc.errno == errno.ENOENT:
        return BadInput(f"cannot write {where}: the folder {Path(path).parent} does not exist")
    return BadInput(f"cannot write {where}: {exc.strerror or exc}")


def check_writable(path: str | Path | None, flag: str) -> None:
    """Refuse, before any work, an output path whose folder is missing or not writable (exit 2)."""
    if path is None:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise BadInput(f"{flag} {p}: is a folder, not a file")
    if not parent.is_dir():
        raise BadInput(f"{flag} {p}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {p}: the folder {parent} is not writable")


def atomic_write_text(path: str | Path, text: str, *, flag: str | None = None, mode: int | None = None,
                      errors: str = "strict") -> Path:
    """Write ``text`` to ``path`` whole or not at all: temp file beside it, fsync, rename.

    A full disk leaves the old file (or none), never a truncated one, and raises one line naming the path.
    ``mode`` sets the file's permissions (0o600 for the spool)."""
    target = Path(path)
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8", errors=errors, newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        else:  # mkstemp makes 0600; a plain output file gets the usual umask-derived mode
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise os_refusal(exc, target, flag) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return target
