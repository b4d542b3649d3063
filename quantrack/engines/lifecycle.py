"""ManagedServer: one engine server as a child process that is never left behind.

Owns: starting an argv (never through a shell) in its own process group with its output captured
to a log file, waiting for ``/health`` (llama.cpp: 200 *and* ``{"status": "ok"}``), detecting an
early exit (EngineError quoting the log's last lines), and stopping: SIGTERM to the group, wait,
then SIGKILL. Context manager; also stopped on KeyboardInterrupt and at interpreter exit (atexit +
a weak registry of live servers). On Linux the engine also dies with its parent when the parent is
SIGKILLed (nothing above runs then): it is started through ``quantrack/engines/reaper.py``, which
arms ``PR_SET_PDEATHSIG`` (SIGTERM) and execs the engine in place (see that module for why not
``preexec_fn``, and the thread caveat).

Also owns the one mapping from a study's arm to its LaunchSpec (``launch_spec_for_study``): ``run``
serves it and ``preflight`` prints it, so the two commands cannot disagree.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from quantrack.errors import BadInput, EngineError

_REAPER = Path(__file__).with_name("reaper.py")
_LIVE: weakref.WeakSet[ManagedServer] = weakref.WeakSet()


def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):  # interpreter shutdown: best effort, never raise
            server.stop()


atexit.register(_stop_all)


def kill_all() -> str:
    """SIGKILL the process group of every live server now (a forced exit: no time to wait for them);
    returns which (``pid N, pid M``), empty when none was live."""
    killed = []
    procs = []
    for server in list(_LIVE):
        if server.proc is not None:
            server._signal_group(server.proc.pid, signal.SIGKILL)
            killed.append(f"pid {server.proc.pid}")
            procs.append(server.proc)
    for proc in procs:  # reaped before the exit, so none is left behind even as a zombie (bounded: 2 s each)
        with contextlib.suppress(Exception):
            proc.wait(timeout=2.0)
    return ", ".join(killed)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail(path: str | Path, n: int = 20) -> list[str]:
    """The last ``n`` lines of a (possibly huge, possibly binary) log file."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return list(deque((ln.rstrip("\r") for ln in data.split("\n") if ln.strip()), maxlen=n))



MIN_FREE_BYTES = 64 * 1024  # below this the engine's startup log cannot be written whole


def disk_full_note(folder: Path) -> str | None:
    """A line naming the disk when the filesystem holding ``folder`` has less than MIN_FREE_BYTES free for this
    user (a full work folder failed the next arm's engine with only "(empty log)"); None when there is room or it
    cannot be told."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    free = st.f_bavail * st.f_frsize
    if free >= MIN_FREE_BYTES:
        return None
    return (f"no space left on the disk holding {folder} ({free:,} bytes free): free some space there or put the "
            "work folder on another disk")

class ManagedServer:
    """Start ``argv`` as a server, wait until healthy, stop it cleanly.

    ``port`` is the port the argv listens on (the caller builds the argv with it; use
    ``free_port()`` or ``ManagedServer.for_spec`` when the port should be picked here).
    """

    def __init__(
        self,
        argv: list[str],
        *,
        port: int,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        health_path: str = "/health",
        require_status_ok: bool = False,
        startup_timeout: float = 600.0,
        stop_timeout: float = 15.0,
        cwd: str | Path | None = None,
        name: str = "server",
        die_with_parent: bool = True,
    ) -> None:
        if not argv or not all(isinstance(a, str) for a in argv):
            raise EngineError("server argv must be a non-empty list of strings")
        self.argv = list(argv)
        self.host = host
        self.port = port
        self.env = dict(env or {})
        self.health_path = health_path
        self.require_status_ok = require_status_ok
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.cwd = str(cwd) if cwd else None
        self.name = name
        self.die_with_parent = die_with_parent
        if log_path is None:
            fd, tmp = tempfile.mkstemp(prefix=f"quantrack-{name}-", suffix=".log")
            os.close(fd)
            log_path = tmp
        self.log_path = Path(log_path)
        self.log_flag: str | None = None  # what messages call the log path (serve: --log)
        self.proc: subprocess.Popen[bytes] | None = None

    # -- construction from an adapter ------------------------------------------------------------
    @classmethod
    def for_spec(cls, adapter: Any, spec: Any, **kwargs: Any) -> ManagedServer:
        """Build from an EngineAdapter and a LaunchSpec; ``spec.port == 0`` picks a free port."""
        from dataclasses import replace

        if not spec.port:
            spec = replace(spec, port=free_port(spec.host))
        argv = adapter.launch_argv(spec)
        env = adapter.launch_env(spec)
        kwargs.setdefault("health_path", adapter.serving.health_path)
        kwargs.setdefault("require_status_ok", adapter.serving.health_needs_status_ok)
        kwargs.setdefault("name", adapter.kind)
        return cls(argv, port=spec.port, host=spec.host, env=env, **kwargs)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------------------
    def popen_argv(self) -> list[str]:
        """What is actually exec'd: ``argv`` behind the parent-death wrapper on Linux, else ``argv``."""
        if self.die_with_parent and sys.platform.startswith("linux") and sys.executable and _REAPER.is_file():
            return [sys.executable, "-S", "-E", str(_REAPER), "--ppid", str(os.getpid()), "--", *self.argv]
        return list(self.argv)

    def _check_executable(self, env: dict[str, str]) -> None:
        """The errors Popen would raise for a missing/non-executable argv[0], raised before the wrapper
        runs (behind it, a bad path would only show up as an early exit)."""
        exe = self.argv[0]
        if os.sep in exe:
            path = exe if os.path.isabs(exe) or not self.cwd else os.path.join(self.cwd, exe)
            if not os.path.exists(path):
                raise EngineError(f"cannot start {self.name}: {exe!r} not found (No such file or directory)")
            if os.path.isdir(path) or not os.access(path, os.X_OK):
                raise EngineError(f"cannot start {self.name}: {exe!r} is not executable")
        elif shutil.which(exe, path=env.get("PATH", os.defpath)) is None:
            raise EngineError(f"cannot start {self.name}: {exe!r} not found (No such file or directory)")

    def start(self, wait: bool = True) -> Self:
        if self.running():
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # keys, then .get(): MLflow's telemetry thread may unset a variable meanwhile (issue #31)
        env = {k: v for k in list(os.environ) if (v := os.environ.get(k)) is not None}
        env.update({**self.env, "PYTHONUNBUFFERED": "1"})
        self._check_executable(env)
        full = disk_full_note(self.log_path.parent)
        if full:  # its log (and, in a work folder, its arm's files) could not be written: say so, start nothing
            raise EngineError(f"cannot start {self.name}: {full}")
        from quantrack.store.files import open_regular_fd

        # never through a link (O_NOFOLLOW: also one planted after any check) and only into a regular file,
        # which is tailed and parsed afterwards (issue #43)
        log = open_regular_fd(self.log_path, append=True, flag=self.log_flag, why="the engine's log is parsed")
        try:
            self.proc = subprocess.Popen(
                self.popen_argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self.cwd, start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise EngineError(f"cannot start {self.name}: {self.argv[0]!r} not found ({exc.strerror})") from exc
        except PermissionError as exc:
            raise EngineError(f"cannot start {self.name}: {self.argv[0]!r} is not executable") from exc
        finally:
            os.close(log)
        _LIVE.add(self)
        if wait:
            try:
                self.wait_ready()
            except BaseException:  # EngineError, timeout, KeyboardInterrupt: never leave it running
                self.stop()
                raise
        return self

    def _healthy(self, client: Any) -> bool:
        try:
            r = client.get(f"{self.base_url}{self.health_path}")
        except Exception:  # noqa: BLE001 - connection refused/reset while the server boots
            return False
        if r.status_code != 200:
            return False
        if not self.require_status_ok:
            return True
        try:
            return bool(r.json().get("status") == "ok")
        except ValueError:
            return False

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll health until 200 (and status ok); EngineError on early exit or timeout."""
        import httpx

        deadline = time.monotonic() + (self.startup_timeout if timeout is None else timeout)
        delay = 0.1
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.proc is None:
                    raise EngineError(f"{self.name} was not started")
                rc = self.proc.poll()
                if rc is not None:
                    raise EngineError(self._died_message(rc))
                if self._healthy(client):
                    return
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"{self.name} did not become healthy at {self.base_url}{self.health_path} within "
                        f"{self.startup_timeout if timeout is None else timeout:.0f} s; log {self.log_path}; "
                        "last lines: " + " | ".join(tail(self.log_path, 20))
                    )
                time.sleep(delay)
                delay = min(delay * 1.5, 1.0)

    def _died_message(self, rc: int) -> str:
        lines = tail(self.log_path, 20)
        if not lines:  # nothing written: a full disk is the first suspect (the engine's output went nowhere)
            full = disk_full_note(self.log_path.parent)
            return (f"{self.name} exited with code {rc} before it was ready (log {self.log_path}): "
                    + (full if full else "the log is empty"))
        return (f"{self.name} exited with code {rc} before it was ready (log {self.log_path}); last lines: "
                + " | ".join(lines))

    def stop(self) -> int | None:
        """SIGTERM the process group, wait ``stop_timeout``, then SIGKILL. Returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        _LIVE.discard(self)
        if proc.poll() is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # children of the leader may outlive it: make sure the whole group is gone
        self._signal_group(proc.pid, signal.SIGKILL)
        return proc.returncode

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop()

    def serve_forever(self, poll: float = 1.0) -> int:
        """Block until the server exits, Ctrl-C or SIGTERM; always stops it. Returns the exit code."""
        import threading

        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _term)  # `kill` stops the child too, like Ctrl-C
        try:
            while self.running():
                time.sleep(poll)
            if self.proc is not None and self.proc.returncode not in (0, None, -signal.SIGTERM):
                raise EngineError(self._died_message(self.proc.returncode))
        finally:
            rc = self.stop()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        return rc or 0


def server_for_arm(
    engine: str,
    model: str,
    arm: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    context_len: int | None = None,
    util: float | None = None,
    tp: int = 1,
    parallel: int = 1,
    served_name: str | None = None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    binary: str | None = None,
    log_path: str | Path | None = None,
    startup_timeout: float = 900.0,
) -> ManagedServer:
    """A ManagedServer (not started) for one arm on one engine; ``port=0`` picks a free port."""
    from quantrack.engines import get_adapter
    from quantrack.engines.base import LaunchSpec

    adapter = get_adapter(engine)
    if adapter.serving.local_file and not Path(str(arm.model or model)).is_file():
        raise BadInput(f"GGUF file not found: {arm.model or model}")
    spec = LaunchSpec(model=model, arm=arm, host=host, port=port or free_port(host), context_len=context_len,
                      util=util, tp=tp, parallel=parallel, served_name=served_name, extra_args=tuple(extra_args),
                      env=dict(env or {}), binary=binary)
    return ManagedServer.for_spec(adapter, spec, log_path=log_path, startup_timeout=startup_timeout,
                                  name=f"{adapter.kind}-{arm.name}")


def launch_spec_for_study(study: Any, arm: Any, *, port: int | None = None) -> Any:
    """The LaunchSpec that serves ``arm`` of ``study``: ``run`` starts it, ``preflight`` prints it.

    ``port=None`` keeps the study's ``[engine] port`` (0 = the caller picks a free one). Model
    references (``smollm2:Q8_0``) must already be resolved to files by the caller.
    """
    from quantrack.engines import get_adapter
    from quantrack.engines.base import LaunchSpec

    model = arm.model or study.model.path or study.model.gguf or study.model.name
    if not model:
        raise BadInput("the study's [model] needs a path (what the engine serves)")
    gpu_engine = get_adapter(study.engine.kind).memory.gpu_share
    return LaunchSpec(model=model, arm=arm, host=study.engine.host,
                      port=study.engine.port if port is None else port, context_len=study.context_len,
                      util=study.gpu.util if gpu_engine else None, tp=study.gpu.count, parallel=study.parallel,
                      served_name=study.model.served_name, extra_args=tuple(study.engine.args),
                      env=dict(study.engine.env), binary=study.engine.binary)


def kl_baseline_server(study: Any, baseline: Any, *, log_path: str | Path | None = None) -> ManagedServer:
    """The KL baseline's server (not started), through the same launch spec as every arm of the study
    (``launch_spec_for_study``): only the arm and the memory share differ (``[eval] kl_baseline_util``, else
    the study's util), with one slot (``EngineAdapter.side_server_spec``) on a free port."""
    from quantrack.engines import get_adapter

    adapter = get_adapter(study.engine.kind)
    util = study.eval.kl_baseline_util if study.eval.kl_baseline_util is not None else study.gpu.util
    spec = adapter.side_server_spec(launch_spec_for_study(study, baseline, port=0), util)
    if adapter.serving.local_file and not Path(spec.arm.model or spec.model).is_file():
        raise BadInput(f"GGUF file not found: {spec.arm.model or spec.model}")
    return ManagedServer.for_spec(adapter, spec, log_path=log_path, startup_timeout=study.engine.ready_timeout_s,
                                  name=f"{adapter.kind}-{baseline.name}-kl-baseline")


def server_for_study(study: Any, arm_name: str, log_path: str | Path | None = None) -> ManagedServer:
    """The ManagedServer for arm ``arm_name`` of a loaded Study (not started)."""
    from quantrack.engines import get_adapter
    from quantrack.errors import did_you_mean

    names = [a.name for a in study.arms]
    if arm_name not in names:
        raise BadInput(f"arm {arm_name!r} is not in study {study.name!r}{did_you_mean(arm_name, names)}; "
                       f"arms: {', '.join(names)}")
    arm = next(a for a in study.arms if a.name == arm_name)
    spec = launch_spec_for_study(study, arm)
    adapter = get_adapter(study.engine.kind)
    if adapter.serving.local_file and not Path(spec.model).is_file():
        raise BadInput(f"GGUF file not found: {spec.model}")
    return ManagedServer.for_spec(adapter, spec, log_path=log_path, startup_timeout=study.engine.ready_timeout_s,
                                  name=f"{adapter.kind}-{arm.name}")

