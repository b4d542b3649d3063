"""Which process wrote a run, and whether it is still there: what `quantrack sync --stale` needs to end a run that a
``kill -9`` (or a machine that lost power) left RUNNING, and to leave every other run alone.

Every record carries its writer's identity as tags (``process_tags``): the host name, the kernel's boot id, the
PID namespace, the pid and the process's start time. ``process_state`` compares them with this process's own:

* ``gone``: the same host, boot and PID namespace, and no process with that pid, or one started at another time
  (the pid was reused), or a zombie (it exited, not yet reaped);
* ``alive``: that process is still there (or it exists and its start time cannot be read: left alone);
* ``unknown``: anything else (another host or boot or namespace, a run without the tags): never touched, and why.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from quantrack.run.schema import Tag

GONE, ALIVE, UNKNOWN = "gone", "alive", "unknown"
START_TOLERANCE_S = 1.0  # a process start time read twice differs by clock-tick rounding only


@dataclass(frozen=True)
class Here:
    """This process's host identity (host name, boot, PID namespace)."""

    hostname: str
    boot_id: str
    pid_namespace: str


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def boot_id() -> str:
    """The kernel's boot id (Linux), else the boot time psutil reads; ``unknown`` when neither can be read."""
    bid = _read("/proc/sys/kernel/random/boot_id")
    if bid:
        return bid
    try:
        import psutil  # type: ignore[import-untyped]

        return f"boot-time:{int(psutil.boot_time())}"
    except Exception:  # noqa: BLE001 - no boot identity: said as unknown
        return "unknown"


def pid_namespace() -> str:
    """This process's PID namespace (``pid:[4026531836]``): two containers of one kernel share the boot id, never
    the namespace. ``none`` where the system has no such thing (the pid is then the machine's own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "none"


def here() -> Here:
    return Here(socket.gethostname(), boot_id(), pid_namespace())


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None when it cannot be read."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # noqa: BLE001 - gone or not ours to read: the caller decides
        return None


def process_tags() -> dict[str, str]:
    """This process's identity, as a record's tags (set when the run starts)."""
    me = here()
    started = start_time(os.getpid())
    return {Tag.HOSTNAME: me.hostname, Tag.BOOT_ID: me.boot_id, Tag.PID_NAMESPACE: me.pid_namespace,
            Tag.PID: str(os.getpid()), Tag.PID_START: f"{started:.2f}" if started is not None else "unknown"}


Probe = Callable[[int], tuple[bool, float | None, bool]]  # pid -> (exists, start time, zombie)


def probe(pid: int) -> tuple[bool, float | None, bool]:
    """(exists, its start time or None, a zombie) of process ``pid`` on this host."""
    import psutil

    try:
        p = psutil.Process(pid)
        zombie = p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False, None, False
    except psutil.Error:  # not ours to read (AccessDenied): it exists
        return True, None, False
    return True, start_time(pid), zombie


def process_state(tags: Mapping[str, str], me: Here | None = None, look: Probe | None = None) -> tuple[str, str]:
    """(``gone`` | ``alive`` | ``unknown``, why) for the process that wrote a run with these tags."""
    me = me or here()
    host, pid_text = tags.get(Tag.HOSTNAME), tags.get(Tag.PID)
    if not host or not pid_text:
        missing = [t for t in (Tag.HOSTNAME, Tag.PID) if not tags.get(t)]
        return UNKNOWN, (f"the run has no {' or '.join(missing)} tag (written by an older quantrack or another "
                         "tool)")
    if host != me.hostname:
        return UNKNOWN, f"its host {host!r} is not this host ({me.hostname!r})"
    boot, ns = tags.get(Tag.BOOT_ID), tags.get(Tag.PID_NAMESPACE)
    if not boot or boot == "unknown" or boot != me.boot_id:
        return UNKNOWN, (f"it ran under boot {boot or 'unknown'} of a host named {host!r}, this is boot {me.boot_id} "
                         "(this host rebooted, or another host has the same name)")
    if not ns or ns != me.pid_namespace:
        return UNKNOWN, (f"it ran in PID namespace {ns or 'unknown'}, this is {me.pid_namespace} (another "
                         "container of this host)")
    try:
        pid = int(pid_text)
    except ValueError:
        return UNKNOWN, f"its {Tag.PID} tag {pid_text!r} is not a pid"
    exists, started, zombie = (look or probe)(pid)
    if not exists:
        return GONE, f"process {pid} on {host} is gone"
    if zombie:
        return GONE, f"process {pid} on {host} exited (a zombie, not yet reaped)"
    recorded = tags.get(Tag.PID_START)
    try:
        then = float(recorded) if recorded else None
    except ValueError:
        then = None
    if then is not None and started is not None and abs(started - then) > START_TOLERANCE_S:
        return GONE, f"process {pid} on {host} is gone (pid {pid} is now another process, started later)"
    return ALIVE, f"process {pid} on {host} is alive"
