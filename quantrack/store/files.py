"""Files written whole or not at all (the spool, exports, `eval --output`, every command that writes a file),
and the one-line refusals for a path that cannot be written."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import IO

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
    if exc.errno == errno.ELOOP:
        return BadInput(f"cannot write {where}: it is a symbolic link; quantrack does not write through links")
    return BadInput(f"cannot write {where}: {exc.strerror or exc}")


def check_writable(path: str | Path | None, flag: str) -> None:
    """Refuse, before any work, an output path whose folder is missing or not writable (exit 2)."""
    if path is None:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    kind = special_target(p, flag)
    if kind is not None:  # written through: its folder (/dev) need not be writable, the target must be
        if kind not in ("stdout", "stderr") and not os.access(p, os.W_OK):
            raise BadInput(f"{flag} {p}: the {kind} is not writable")
        return
    if p.is_dir():
        raise BadInput(f"{flag} {p}: is a folder, not a file")
    if not parent.is_dir():
        raise BadInput(f"{flag} {p}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {p}: the folder {parent} is not writable")


# --- what is at the path: a regular file is replaced whole, a device or FIFO is written through (issue #43) ---

_STD_STREAMS = {"/dev/stdout": 1, "/dev/stderr": 2}


def special_target(path: str | Path, flag: str | None = None) -> str | None:
    """What ``path`` is when it exists and is not a regular file: "character device", "FIFO" or "stdout"/"stderr"
    (written through, never renamed over); None for a regular file or nothing (the atomic write applies).

    A block device, a socket or a folder is refused with one line (exit 2). A link is followed only to a
    character device or FIFO and ``/dev/stdout`` / ``/dev/stderr`` (what ``--out /dev/stdout`` users mean); a
    link to anything else is refused (quantrack never writes through a link to a file)."""
    p = Path(path)
    where = f"{flag} {p}" if flag else str(p)
    if str(p) in _STD_STREAMS:
        return p.name
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_refusal(exc, p, flag) from None
    linked = stat.S_ISLNK(st.st_mode)
    if linked:
        try:
            followed: os.stat_result | None = os.stat(p)
        except OSError:
            followed = None  # a dangling link
        if followed is None or not (stat.S_ISCHR(followed.st_mode) or stat.S_ISFIFO(followed.st_mode)):
            raise BadInput(f"{where} is a symbolic link (to {os.readlink(p)}): give the file itself; quantrack "
                           "never writes through a link")
        st = followed
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISCHR(st.st_mode):
        return "character device"
    if stat.S_ISFIFO(st.st_mode):
        return "FIFO"
    what = ("a folder" if stat.S_ISDIR(st.st_mode) else "a block device" if stat.S_ISBLK(st.st_mode)
            else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    raise BadInput(f"{where} is {what}: quantrack writes a regular file (replaced whole), or through a "
                   "character device or FIFO")


def write_through(path: str | Path, raw: bytes, kind: str, flag: str | None = None) -> None:
    """Write ``raw`` into an existing character device, FIFO or standard stream (never created, truncated or
    replaced). A FIFO nobody reads is refused at once instead of blocking; any write error is one line, exit 2
    (the target is the user's choice: ``/dev/full`` is "no space left", not a fault of this machine)."""
    p = Path(path)
    where = f"{flag} {p}" if flag else str(p)
    try:
        if kind in ("stdout", "stderr"):
            fd = os.dup(_STD_STREAMS[str(p)])
        else:
            nonblock = os.O_NONBLOCK if kind == "FIFO" else 0
            fd = os.open(p, os.O_WRONLY | nonblock | getattr(os, "O_NOCTTY", 0))
            if nonblock:
                os.set_blocking(fd, True)
    except OSError as exc:
        if exc.errno == errno.ENXIO and kind == "FIFO":
            raise BadInput(f"cannot write {where}: a FIFO that nobody reads (start its reader first)") from None
        raise BadInput(f"cannot write {where} ({kind}): {exc.strerror or exc}") from None
    try:
        view = memoryview(raw)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        raise BadInput(f"cannot write {where} ({kind}): {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str, *, flag: str | None = None, mode: int | None = None,
                      errors: str = "strict") -> Path:
    """Write ``text`` to ``path`` whole or not at all: temp file beside it, fsync, rename.

    A full disk leaves the old file (or none), never a truncated one, and raises one line naming the path.
    ``mode`` sets the file's permissions (0o600 for the spool). A character device or FIFO at ``path`` is
    written through, never replaced (:func:`special_target`)."""
    target = Path(path)
    kind = special_target(target, flag)
    if kind is not None:
        write_through(target, text.encode("utf-8", errors=errors), kind, flag)
        return target
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


# --- outputs never written through a link (issue #30) ---------------------------------------------------

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
    is refused (but one to a device or FIFO, :func:`special_target`); ``mode`` sets the permissions (default:
    the umask's). A character device or FIFO at ``path`` is written through, never replaced."""
    target = Path(path)
    kind = special_target(target, flag)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if kind is not None:
        write_through(target, raw, kind, flag)
        return target
    target = refuse_link(path, flag)
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)
        tmp = Path(name)
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
        raise os_refusal(exc, target, flag) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return target


def open_new(path: str | Path, *, append: bool = False, flag: str | None = None) -> IO[str]:
    """Open ``path`` for text writing (truncate, or append) without following a symbolic link at it."""
    return os.fdopen(open_regular_fd(path, append=append, flag=flag), "a" if append else "w", encoding="utf-8")


def check_regular_target(path: str | Path, flag: str | None = None, why: str = "quantrack reads it back") -> Path:
    """Refuse, before any work, a path quantrack will write and read back (an engine log) that is a symbolic link
    or exists and is not a regular file: one line, exit 2. :func:`open_regular_fd` checks again when it opens."""
    p = refuse_link(path, flag)
    kind = special_target(p, flag)
    if kind is not None:
        where = f"{flag} {p}" if flag else str(p)
        raise BadInput(f"{where} is a {kind}: it must be a regular file ({why})")
    return p


def open_regular_fd(path: str | Path, *, append: bool = False, flag: str | None = None,
                    why: str = "quantrack reads it back") -> int:
    """A file descriptor for writing a file quantrack later reads (records to resume, an engine's log to parse):
    never through a symbolic link (``O_NOFOLLOW``: also one planted after the check), and only a regular file —
    a device or FIFO at the path is refused with one line, exit 2 (reading a FIFO back would block)."""
    p = check_regular_target(path, flag, why)
    where = f"{flag} {p}" if flag else str(p)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags | os.O_NONBLOCK, 0o666)  # O_NONBLOCK: a FIFO swapped in after the check never blocks
    except OSError as exc:
        raise os_refusal(exc, p, flag) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput(f"{where} is not a regular file ({why})")
    os.set_blocking(fd, True)
    return fd


# --- reading a file the user named: only a regular file, never blocking, never unbounded (issue #43) ----------

def file_kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a folder" if stat.S_ISDIR(mode) else "not a regular file")


def open_regular_read(path: str | Path, what: str | None = None) -> IO[bytes]:
    """Open ``path`` for binary reading only when it is a regular file (a link to one is followed): a FIFO is
    opened ``O_NONBLOCK`` (so opening it never waits for a writer) and refused, as are devices (``/dev/zero``
    never ends), sockets and folders. Refusals are one line (BadInput) naming ``what`` (default: the path)."""
    where = what or str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise BadInput(f"{where}: file not found") from None
        if exc.errno == errno.ENXIO:  # a socket
            raise BadInput(f"{where} is not a regular file (a socket)") from None
        raise BadInput(f"{where}: cannot read ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadInput(f"{where} is not a regular file ({file_kind(mode)})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: str | Path, *, limit: int, what: str | None = None) -> bytes:
    """The bytes of a regular file (see :func:`open_regular_read`), refused when larger than ``limit``."""
    where = what or str(path)
    with open_regular_read(path, what) as fh:
        try:
            raw = fh.read(limit + 1)
        except OSError as exc:
            raise BadInput(f"{where}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise BadInput(f"{where}: larger than {limit:,} bytes")
    return raw
