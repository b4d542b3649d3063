"""Running untrusted Python (a model's code answer plus the benchmark's tests) in a sandbox.

One program, one fresh process (:func:`run_python`):

* a fresh temporary directory is its working directory, ``HOME`` and ``TMPDIR``, removed afterwards;
* resource limits set in the child before ``exec`` (``preexec_fn``): ``RLIMIT_CPU`` (CPU seconds),
  ``RLIMIT_AS`` (address space, default 1 GiB), ``RLIMIT_FSIZE`` (largest file written, default 16 MiB),
  ``RLIMIT_NPROC`` (processes of the user; the kernel does not enforce it for root), ``RLIMIT_NOFILE``, no core
  files; a new session (its own process group);
* a wall-clock timeout: the whole process group is killed (``SIGKILL``), and then every process left in the
  sandbox's own mount namespace (a child that left the group with ``setsid`` is found that way);
* where the kernel allows it (root, or ``CAP_SYS_ADMIN``: :func:`isolation`), the child gets new network and mount
  namespaces (``unshare(2)`` through libc): no network at all (only a loopback that is down, so even
  ``127.0.0.1`` is unreachable), every mount read-only, and ``/tmp``, ``/var/tmp`` and ``/dev/shm`` bound to the
  scratch directory, so nothing it writes lands outside it. Without that privilege the fallback is the Python
  guard below alone, and :func:`isolation` says so (``"guard-only"``);
* a Python guard run before the program (in the spirit of human-eval's ``reliability_guard``, openai/human-eval
  ``human_eval/execution.py``): ``socket``, ``os.system``, ``fork``, ``exec*``, ``spawn*``, ``kill``,
  ``subprocess`` and file deletion raise ``PermissionError``. It is not a security boundary by itself (ctypes
  reaches libc); the namespaces and limits are.

A program passes when it exits 0 within its time; anything else (an exception, a limit hit, a timeout) is a failure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_BYTES = 1 << 30  # 1 GiB address space
DEFAULT_FILE_BYTES = 16 << 20  # 16 MiB per file
DEFAULT_NPROC = 64
DEFAULT_NOFILE = 256

# <linux/sched.h>, <linux/mount.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")

# Run before the program: the names a hostile answer would reach for first raise PermissionError.
GUARD = r'''
import builtins, os, shutil, socket, subprocess, sys

def _refuse(*args, **kwargs):
    raise PermissionError("refused in the quantrack sandbox")

class _NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        raise PermissionError("network refused in the quantrack sandbox")

socket.socket = _NoSocket
for _name in ("create_connection", "create_server", "socketpair", "fromfd"):
    setattr(socket, _name, _refuse)
for _name in ("system", "popen", "fork", "forkpty", "kill", "killpg", "setsid", "setuid", "putenv", "unsetenv",
              "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "truncate", "chmod",
              "chown", "fchmod", "fchown", "lchown", "chroot", "fchdir", "posix_spawn", "posix_spawnp",
              "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
              "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "register_at_fork"):
    if hasattr(os, _name):
        setattr(os, _name, _refuse)
shutil.rmtree = shutil.move = shutil.chown = _refuse
subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_call = subprocess.check_output = _refuse
for _mod in ("ctypes", "_ctypes", "multiprocessing", "resource", "psutil", "_posixsubprocess"):
    sys.modules[_mod] = None
builtins.exit = builtins.quit = None
del _refuse, _name, _mod
'''

RUNNER = r'''
import sys
with open("guard.py", encoding="utf-8") as fh:
    exec(compile(fh.read(), "<quantrack-guard>", "exec"), {"__name__": "_guard"})
with open("program.py", encoding="utf-8") as fh:
    source = fh.read()
exec(compile(source, "program.py", "exec"), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S  # wall clock; RLIMIT_CPU is its ceiling in whole seconds
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    file_bytes: int = DEFAULT_FILE_BYTES
    nproc: int = DEFAULT_NPROC
    nofile: int = DEFAULT_NOFILE


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # "passed", "failed", "timeout"
    detail: str  # the last line of stderr, or why it stopped
    wall_s: float
    isolation: str  # "namespaces" or "guard-only"


_ISOLATION: str | None = None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


_LIBC = _libc()


def isolation() -> str:
    """``"namespaces"`` when a child can get its own network and mount namespaces here (tried once, in a throwaway
    process), else ``"guard-only"``."""
    global _ISOLATION
    if _ISOLATION is None:
        if not sys.platform.startswith("linux"):
            _ISOLATION = "guard-only"
        else:
            try:
                pid = os.fork()
            except OSError:
                _ISOLATION = "guard-only"
                return _ISOLATION
            if pid == 0:  # pragma: no cover - the child only reports by exit status
                ok = _LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET) == 0
                os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            _ISOLATION = "namespaces" if os.waitstatus_to_exitcode(status) == 0 else "guard-only"
    return _ISOLATION


def _mount_points() -> list[tuple[str, int]]:
    """Mount points of this (already private) namespace with the per-mount flags a remount must keep."""
    keep = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")
            flags = sum(keep.get(opt, 0) for opt in parts[5].split(","))
            out.append((point, flags))
    return out


def _isolate(scratch: str, libc: ctypes.CDLL, points: list[tuple[str, int]]) -> None:
    """In the child, before exec: private mounts, every mount read-only, the temp dirs bound to the scratch dir,
    no network. Any failure aborts the child (a program never runs half-isolated). ``points`` were read in the
    parent: a new mount namespace starts as a copy of its parent's mounts."""

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"sandbox: {what} failed")

    check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    bound = []
    source = scratch
    for d in PRIVATE_DIRS:  # the first bind may hide the scratch path (it is under /tmp): bind the others from it
        if os.path.isdir(d) and not os.path.islink(d):
            check(libc.mount(source.encode(), d.encode(), None, MS_BIND, None), f"bind {d}")
            bound.append(d)
            source = d
    for point, flags in points:
        if point in bound:
            continue
        # /proc, /sys and friends may refuse a read-only remount; the root and the disks must not
        rc = libc.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None)
        if rc != 0 and (point == "/" or not point.startswith(("/proc", "/sys", "/dev"))):
            check(rc, f"read-only remount of {point}")
    os.chdir("/tmp")


def _preexec(limits: Limits, scratch: str, prepared: tuple[ctypes.CDLL, list[tuple[str, int]]] | None) -> None:
    os.setsid()
    if prepared is not None:
        _isolate(scratch, *prepared)
    cpu = max(1, int(limits.timeout_s + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.nproc, limits.nproc))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile, limits.nofile))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _mnt_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _open_ns(pid: int) -> int | None:
    try:
        return os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    except OSError:  # it has already exited (a zombie's namespaces are gone): the process group kill remains
        return None


def _kill_namespace(ns: str | None, pgid: int) -> None:
    """SIGKILL the process group, then any process still in the sandbox's own mount namespace."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if ns is None or ns == _mnt_ns("self"):
        return
    for _ in range(50):
        left = [int(p) for p in os.listdir("/proc") if p.isdigit() and _mnt_ns(p) == ns]
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)


def run_python(program: str, limits: Limits | None = None, *, guard: bool = True) -> Outcome:
    """Run ``program`` (Python source) in a fresh sandboxed interpreter; ``guard=False`` leaves out the Python guard
    (tests use it to show what the OS-level limits contain by themselves)."""
    limits = limits or Limits()
    namespaces = isolation() == "namespaces"
    prepared = (_LIBC, _mount_points()) if namespaces else None
    scratch = tempfile.mkdtemp(prefix="quantrack-sandbox-")
    try:
        Path(scratch, "guard.py").write_text(GUARD if guard else "", encoding="utf-8")
        Path(scratch, "program.py").write_text(program, encoding="utf-8")
        Path(scratch, "runner.py").write_text(RUNNER, encoding="utf-8")
        env = {"HOME": scratch if not namespaces else "/tmp", "TMPDIR": scratch if not namespaces else "/tmp",
               "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        # stderr goes to an unlinked file, not a pipe: a child that keeps the pipe open cannot stall the wait
        with tempfile.TemporaryFile() as errfile:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "runner.py"], cwd=scratch, env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errfile,
                # preexec_fn with threads (the eval runner's): everything it needs is prepared here, in the parent;
                # the child only makes system calls through an already loaded libc
                preexec_fn=lambda: _preexec(limits, scratch, prepared), close_fds=True)  # noqa: PLW1509
            # hold the namespace open while it is in use: a freed namespace's inode number can be reused by the
            # next sandbox's (other threads run sandboxes too), and then its processes would be taken for this one's
            ns_fd = _open_ns(proc.pid) if namespaces else None
            ns = _mnt_ns(proc.pid) if ns_fd is not None else None
            try:
                proc.wait(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_namespace(ns, proc.pid)  # the group, and any child that left it, die with it
            proc.wait()
            wall = time.monotonic() - t0
            if ns_fd is not None:
                os.close(ns_fd)
            errfile.seek(max(0, os.fstat(errfile.fileno()).st_size - 4096))
            err = errfile.read()
    except subprocess.SubprocessError as exc:  # preexec failed: the program never ran
        return Outcome(False, "failed", f"sandbox could not start: {exc}", 0.0, isolation())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
    if timed_out:
        return Outcome(False, "timeout", f"killed after {limits.timeout_s:g} s wall clock", wall, isolation())
    if proc.returncode == 0:
        return Outcome(True, "passed", "", wall, isolation())
    why = tail[0][:200] if tail else (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                                      else f"exit status {proc.returncode}")
    return Outcome(False, "failed", why, wall, isolation())
