"""Writing output files safely: whole or not at all, never through a symbolic link, every error naming the path.

* :func:`write_atomic` writes a temporary file beside the target, fsyncs it and renames it over the target: a full
  disk leaves the old file (or none), never a 0-byte or truncated one, and the message names the path.
* :func:`refuse_link` refuses an output path that is a symbolic link (``report --out LINK``, ``eval --output
  LINK --overwrite``): quantrack never writes through a link to a file the user did not name.
* :func:`open_new` opens a file for streaming writes (eval records) without following a link at its path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import IO

from quantrack.errors import BadInput, QuantrackError


class DiskError(QuantrackError):
    """The OS refused to write a file quantrack needed (full disk, read-only, I/O error): one line, the path."""

    exit_code = 1


def refusal(exc: OSError, path: str | Path, flag: str | None = None) -> QuantrackError:
    """One line for an OS refusal naming the path: the machine's fault (exit 1) or the user's path (exit 2)."""
    where = f"{flag} {path}" if flag else str(path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskError(f"no space left on device writing {where}")
    if exc.errno in (errno.EIO, errno.EROFS):
        return DiskError(f"cannot write {where}: {exc.strerror}")
    if exc.errno == errno.ENOENT:
        return BadInput(f"cannot write {where}: the folder {Path(path).parent} does not exist")
    if exc.errno == errno.ELOOP:
        return BadInput(f"cannot write {where}: it is a symbolic link; quantrack does not write through links")
    return BadInput(f"cannot write {where}: {exc.strerror or exc}")


def refuse_link(path: str | Path, flag: str | None = None) -> Path:
    """``path`` unless it is a symbolic link (even a dangling one): one line, exit 2."""
    p = Path(path)
    if p.is_symlink():
        where = f"{flag} {p}" if flag else str(p)
        raise BadInput(f"{where} is a symbolic link (to {os.readlink(p)}): give the file itself; quantrack never "
                       "writes through a link")
    return p


def write_atomic(path: str | Path, data: str | bytes, *, flag: str | None = None, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` whole or not at all (temp file beside it, fsync, rename). A link at ``path``
    is refused; ``mode`` sets the permissions (default: the umask's)."""
    target = refuse_link(path, flag)
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)
        tmp = Path(name)
        raw = data.encode("utf-8") if isinstance(data, str) else data
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise refusal(exc, target, flag) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return target


def open_new(path: str | Path, *, append: bool = False, flag: str | None = None) -> IO[str]:
    """Open ``path`` for text writing (truncate, or append) without following a symbolic link at it."""
    p = refuse_link(path, flag)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags, 0o666)
    except OSError as exc:
        raise refusal(exc, p, flag) from None
    return os.fdopen(fd, "a" if append else "w", encoding="utf-8")
