"""`kill -9` of a real `quantrack run` (issue #43): the study's parent run is left RUNNING in the store (nothing in
the process could end it). `quantrack sync --stale` leaves it alone while that process lives, and ends it KILLED,
tagged with why, once the process is gone. The run is real (a `quantrack run` process, the fake engine's server
process of tests/fake_engine.py, a real sqlite MLflow store); only the engine is a test fixture."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from quantrack.run.schema import Tag
from quantrack.store.tracking import load_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 120.0

STUDY = """
name = "kill9"
context_len = 1024
[model]
path = "fake-model.gguf"
[engine]
kind = "fake"
ready_timeout_s = 60.0
[gpu]
name = "x86-cpu"
[latency]
input_tokens = 8
output_tokens = 6
warmup = 0
iterations = 2
[sweep]
concurrency = [1, 2]
requests_per_level = 400
input_tokens = 8
output_tokens = 6
[[arms]]
name = "base"
weights = "f16"
baseline = true
"""


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "QUANTRACK_SPOOL_DIR": str(tmp / "spool")}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _sync_stale(uri: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantrack", "sync", "--stale", "--tracking-uri", uri],
                          capture_output=True, text=True, cwd=tmp, env=_env(tmp), timeout=DEADLINE_S, check=False)


def test_kill9_leaves_the_parent_running_and_sync_stale_ends_it(tmp_path: Path) -> None:
    (tmp_path / "study.toml").write_text(STUDY, encoding="utf-8")
    (tmp_path / "fake-model.gguf").write_bytes(b"GGUF")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fake_quantrack.py"), "--interval-ms", "20", "run", "study.toml",
         "--tracking-uri", uri, "--workdir", str(tmp_path / "work")],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path, env=_env(tmp_path))
    lines: list[str] = []
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            q.put(line.rstrip("\n"))
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    engine_pid = None
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            try:
                line = q.get(timeout=1.0)
            except queue.Empty:
                continue
            assert line is not None, "exited before its sweep:\n" + "\n".join(lines[-20:])
            lines.append(line)
            if (m := re.search(r"\[base\] server ready at \S+ \(pid (\d+)\)", line)):
                engine_pid = int(m.group(1))
            if "[base] sweep: concurrency" in line:
                break
        else:
            raise AssertionError("no sweep line:\n" + "\n".join(lines[-20:]))
        # while `quantrack run` lives, its RUNNING parent is its own: left alone
        alive = _sync_stale(uri, tmp_path)
        assert alive.returncode == 0, alive.stderr[-2000:]
        assert "left RUNNING 1 (process alive)" in alive.stdout, alive.stdout + alive.stderr
        assert f"process {proc.pid} on " in alive.stderr and "is alive" in alive.stderr
        (parent,) = load_runs("kill9", uri, role="study")
        assert parent.status == "RUNNING"

        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        (parent,) = load_runs("kill9", uri, role="study")
        assert parent.status == "RUNNING"  # what kill -9 leaves: nothing in the process could end it
        assert parent.tags[Tag.PID] == str(proc.pid)

        ended = _sync_stale(uri, tmp_path)
        assert ended.returncode == 0, ended.stderr[-2000:]
        assert "stale: ended KILLED 1 (process gone)" in ended.stdout, ended.stdout + ended.stderr
        (parent,) = load_runs("kill9", uri, role="study")
        assert parent.status == "KILLED"
        assert parent.tags[Tag.ENDED_BY].startswith(f"sync --stale: process {proc.pid} on ")
        again = _sync_stale(uri, tmp_path)
        assert "stale: ended KILLED 0" in again.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if engine_pid is not None:  # the engine dies with its parent (the reaper); never left behind by the test
            deadline = time.monotonic() + 15.0
            while time.monotonic() < deadline:
                try:
                    os.kill(engine_pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                os.kill(engine_pid, signal.SIGKILL)
                raise AssertionError(f"the fake engine {engine_pid} outlived the killed `quantrack run`")


def test_kill9_in_the_sweep_keeps_the_finished_latency_and_sync_uploads_it(tmp_path: Path) -> None:
    """Issue #43 (b): every finished step is on disk the moment it finishes (a step checkpoint in the spool), so a
    `kill -9` of quantrack in the sweep loses the arm's finished latency no more: a `quantrack sync` while the run
    lives leaves its checkpoint alone; once the process is gone it uploads the arm KILLED "after latency", with its
    latency figures. A second sync uploads nothing more."""
    (tmp_path / "study.toml").write_text(STUDY.replace('name = "kill9"', 'name = "kill9-steps"'), encoding="utf-8")
    (tmp_path / "fake-model.gguf").write_bytes(b"GGUF")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    env = _env(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fake_quantrack.py"), "--interval-ms", "20", "run", "study.toml",
         "--tracking-uri", uri, "--workdir", str(tmp_path / "work")],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path, env=env)
    assert proc.stderr is not None
    lines: list[str] = []

    def sync() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "quantrack", "sync", "--tracking-uri", uri], capture_output=True,
                              text=True, cwd=tmp_path, env=env, timeout=DEADLINE_S, check=False)

    try:
        deadline = time.monotonic() + DEADLINE_S
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "[base] sweep: concurrency" in line or time.monotonic() > deadline:
                break
        assert any("[base] sweep: concurrency" in ln for ln in lines), "\n".join(lines[-20:])
        alive = sync()
        assert alive.returncode == 0, alive.stderr[-2000:]
        assert "step checkpoints left: 1" in alive.stdout, alive.stdout + alive.stderr
        assert load_runs("kill9-steps", uri) == []  # the arm is not in the store while it runs
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        done = sync()
        assert done.returncode == 0, done.stderr[-2000:]
        assert "uploaded 1," in done.stdout, done.stdout + done.stderr
        (arm,) = load_runs("kill9-steps", uri)
        assert arm.status == "KILLED" and arm.tags[Tag.FAILED_STEP] == "after latency", arm.tags
        assert "step_latency_s" in arm.metrics and arm.metrics.get("tpot_ms_p50", 0) > 0, sorted(arm.metrics)
        again = sync()
        assert "uploaded 0," in again.stdout and "checkpoints left" not in again.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
