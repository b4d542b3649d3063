"""Exec wrapper that ties an engine's life to quantrack's: ``reaper.py --ppid PID -- argv...``.

ManagedServer starts every engine through this file on Linux. It asks the kernel to send SIGTERM
to this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``), checks that the parent did not
die before that was armed, then ``execvp``s the engine in place: same pid, same process group, and
the death signal survives the exec. A parent killed with SIGKILL (no atexit, no ``finally``) so
no longer leaves an engine behind holding a GPU.

Why a wrapper and not ``preexec_fn``: ``preexec_fn`` runs Python between fork and exec, which can
deadlock when the parent has other threads (HTTP clients, thread pools, Ray); an exec'd interpreter
has no such state. Run by path with ``python -S -E``: stdlib only, no quantrack import, ~20 ms.

Caveat (kernel semantics): the signal fires when the parent *thread* that started the engine exits,
not only the process; a server must therefore be started from a thread that outlives it (the main
thread, or stop the server before the worker thread ends).
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
EXIT_PARENT_GONE = 143  # what a SIGTERM'd process reports (128 + 15): the parent died before the exec
EXIT_CANNOT_EXEC = 127  # the shell's "command not found"


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel for ``sig`` when the parent thread exits (Linux); False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def main(args: list[str]) -> int:
    ppid = 0
    if args[:1] == ["--ppid"] and len(args) > 1:
        ppid = int(args[1])
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("quantrack-reaper: usage: reaper.py [--ppid PID] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    set_parent_death_signal(signal.SIGTERM)
    if ppid and os.getppid() != ppid:  # the parent died between fork and prctl: do not start an orphan
        return EXIT_PARENT_GONE
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        print(f"quantrack-reaper: cannot start {args[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_EXEC
    return EXIT_CANNOT_EXEC  # not reached: execvp returns only by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
