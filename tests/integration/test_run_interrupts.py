"""Nothing measured is lost, nothing interrupted is called finished: `quantrack run` on a real llama.cpp server
(xllamacpp, the SmolLM2 GGUF arms from conftest), interrupted by SIGINT in each step (latency, sweep, eval, KL)
and by SIGTERM. Each case asserts what is in the store afterwards: the arm KILLED with the step it was in and
every figure and artifact of the steps before (and the partial one of the step it was in), the parent run
KILLED (never left RUNNING), exit 130 / 143, and no engine process left.

The signal is sent once the step is under way (its progress line, or for eval its first answered record on
disk). Lean on purpose (2-core machine): the interrupted step is made long, every other step short; each case
is bounded by a deadline far above its quiet time."""

from __future__ import annotations

import json
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

from quantrack.store.tracking import load_runs, read_artifact_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 240.0  # per wait; quiet time is a few seconds


def _study(tmp: Path, gguf: dict[str, Path], *, latency_iters: int = 1, sweep: str = "", eval_q: int = 0,
           kl_tokens: int = 0) -> Path:
    ev = (f'task = "gsm8k"\nnum_questions = {eval_q}\nnum_shots = 1\nmax_tokens = 24\nconcurrency = 1\n'
          if eval_q else "")
    if kl_tokens:
        ev += f'kl = {{ tokens = {kl_tokens}, top_k = 5, arms = ["q4_0"] }}\n'
    text = f"""
name = "interrupts"
context_len = 1024
parallel = 1
[model]
gguf = "{gguf['Q8_0']}"
[engine]
kind = "llamacpp"
ready_timeout_s = 180.0
[gpu]
name = "cpu"
[latency]
input_tokens = 16
output_tokens = 8
warmup = 0
iterations = {latency_iters}
{sweep}
[eval]
{ev}
[[arms]]
name = "q8_0"
weights = "q8_0"
model = "{gguf['Q8_0']}"
baseline = true
"""
    if kl_tokens:
        text += f"""
[[arms]]
name = "q4_0"
weights = "q4_0"
model = "{gguf['Q4_0']}"
"""
    path = tmp / "study.toml"
    path.write_text(text, encoding="utf-8")
    return path


class Run:
    """`python -m quantrack run` in a subprocess, its stderr read line by line."""

    def __init__(self, study: Path, tmp: Path) -> None:
        self.uri = f"sqlite:///{tmp}/store/mlflow.db"
        self.workdir = tmp / "work"
        env = {**os.environ, "PYTHONPATH": str(REPO), "QUANTRACK_SPOOL_DIR": str(tmp / "spool")}
        env.pop("MLFLOW_TRACKING_URI", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quantrack", "run", str(study), "--tracking-uri", self.uri,
             "--workdir", str(self.workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, env=env)
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        rx = re.compile(pattern)
        for line in self.lines:
            if (m := rx.search(line)):
                return m
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"exited before {pattern!r}:\n" + "\n".join(self.lines[-30:]))
            self.lines.append(line)
            if (m := rx.search(line)):
                return m
        self.proc.kill()
        raise AssertionError(f"no {pattern!r} within {DEADLINE_S} s:\n" + "\n".join(self.lines[-30:]))

    def finish(self) -> int:
        try:
            rc = self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        while (line := self._q.get(timeout=10)) is not None:
            self.lines.append(line)
        return rc

    def pids(self) -> list[int]:
        """Every engine process group the run started (the group id is the leader's pid)."""
        return [int(p) for ln in self.lines for p in re.findall(r"\(pid (\d+)\)", ln)]


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def _assert_closed(run: Run, rc: int, want_rc: int) -> dict[str, object]:
    assert rc == want_rc, "\n".join(run.lines[-30:])
    assert run.pids(), "no engine was started"
    for pgid in run.pids():
        assert _gone(pgid), f"engine process group {pgid} outlived `quantrack run`"
    parent = load_runs("interrupts", run.uri, role="study")
    assert [p.status for p in parent] == ["KILLED"]  # closed, never left RUNNING
    return {r.arm: r for r in load_runs("interrupts", run.uri)}


def _artifact(run: Run, run_id: str, path: str) -> str | None:
    return read_artifact_text(run_id, path, run.uri)


def _interrupted_arm(runs: dict[str, object], arm: str, step: str) -> object:
    r = runs[arm]
    assert r.status == "KILLED", r.status  # type: ignore[attr-defined]
    tags = r.tags  # type: ignore[attr-defined]
    assert tags["quantrack.failed_step"] == step
    assert step in tags["quantrack.error"] and "interrupted" in tags["quantrack.error"] or \
        "terminated" in tags["quantrack.error"]
    # what the steps before measured: the startup log's figures and the serve step's time
    metrics = r.metrics  # type: ignore[attr-defined]
    for key in ("weights_gib", "kv_tokens_reported", "step_serve_s", "step_parse_log_s"):
        assert key in metrics, key
    return r


@pytest.fixture(autouse=True)
def _need_xllamacpp() -> None:
    pytest.importorskip("xllamacpp")


def test_sigint_in_latency_logs_the_partial_latency(gguf_arms: dict[str, Path], tmp_path: Path) -> None:
    run = Run(_study(tmp_path, gguf_arms, latency_iters=400), tmp_path)
    run.wait_for(r"\[q8_0\] latency: batch 1")
    time.sleep(3.0)  # a few requests in
    run.proc.send_signal(signal.SIGINT)
    runs = _assert_closed(run, run.finish(), 130)
    r = _interrupted_arm(runs, "q8_0", "latency")
    row = json.loads(_artifact(run, r.run_id, "latency/latency.json") or "{}")  # type: ignore[attr-defined]
    assert row["interrupted"] is True and row["iterations"] == 400
    assert row["n_ok"] == len([s for s in row["samples"] if s.get("ok", True)]) < 400
    assert _artifact(run, r.run_id, "launch/command.txt")  # type: ignore[attr-defined]
    assert "quantrack: interrupted (SIGINT)" in run.lines[-1]


def test_sigterm_in_latency_is_143_and_killed(gguf_arms: dict[str, Path], tmp_path: Path) -> None:
    run = Run(_study(tmp_path, gguf_arms, latency_iters=400), tmp_path)
    run.wait_for(r"\[q8_0\] latency: batch 1")
    time.sleep(2.0)
    run.proc.send_signal(signal.SIGTERM)
    runs = _assert_closed(run, run.finish(), 143)
    r = _interrupted_arm(runs, "q8_0", "latency")
    assert "SIGTERM" in r.tags["quantrack.error"]  # type: ignore[attr-defined]
    assert _artifact(run, r.run_id, "latency/latency.json")  # type: ignore[attr-defined]


def test_sigint_in_sweep_keeps_latency_and_finished_levels(gguf_arms: dict[str, Path], tmp_path: Path) -> None:
    sweep = "[sweep]\nconcurrency = [1, 2]\nrequests_per_level = 200\n"
    run = Run(_study(tmp_path, gguf_arms, sweep=sweep), tmp_path)
    run.wait_for(r"\[q8_0\] sweep: concurrency")
    time.sleep(2.0)
    run.proc.send_signal(signal.SIGINT)
    runs = _assert_closed(run, run.finish(), 130)
    r = _interrupted_arm(runs, "q8_0", "sweep")
    assert "tpot_ms_p50" in r.metrics and "step_latency_s" in r.metrics  # type: ignore[attr-defined]
    data = json.loads(_artifact(run, r.run_id, "sweep/sweep.json") or "{}")  # type: ignore[attr-defined]
    assert data["interrupted"] is True
    assert _artifact(run, r.run_id, "latency/latency.json")  # type: ignore[attr-defined]


def test_sigint_in_eval_keeps_latency_and_answered_questions(gguf_arms: dict[str, Path], tmp_path: Path) -> None:
    run = Run(_study(tmp_path, gguf_arms, eval_q=200), tmp_path)
    run.wait_for(r"\[q8_0\] eval: gsm8k")
    records = tmp_path / "work" / "q8_0-gsm8k.jsonl"
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not (records.is_file() and records.read_text().count("\n") >= 1):
        time.sleep(0.2)
    run.proc.send_signal(signal.SIGINT)
    runs = _assert_closed(run, run.finish(), 130)
    r = _interrupted_arm(runs, "q8_0", "eval")
    m = r.metrics  # type: ignore[attr-defined]
    assert "tpot_ms_p50" in m and "step_latency_s" in m
    assert 1 <= m["gsm8k_n"] < 200  # the questions answered before the interrupt, not 0 and not all
    assert _artifact(run, r.run_id, "eval/records.jsonl")  # type: ignore[attr-defined]
    result = json.loads(_artifact(run, r.run_id, "eval/result.json") or "{}")  # type: ignore[attr-defined]
    assert result["settings"]["interrupted"] is True


def test_sigint_in_kl_keeps_the_candidate_and_stops_both_servers(gguf_arms: dict[str, Path], tmp_path: Path) -> None:
    run = Run(_study(tmp_path, gguf_arms, kl_tokens=4000), tmp_path)
    run.wait_for(r"\[q4_0\] kl: baseline 'q8_0' served at")
    time.sleep(2.0)
    run.proc.send_signal(signal.SIGINT)
    runs = _assert_closed(run, run.finish(), 130)
    assert len(run.pids()) == 3  # baseline arm, candidate, KL baseline: every one gone (checked above)
    assert runs["q8_0"].status == "FINISHED"  # type: ignore[attr-defined]
    r = _interrupted_arm(runs, "q4_0", "kl")
    assert "tpot_ms_p50" in r.metrics and "kl_mean" not in r.metrics  # type: ignore[attr-defined]
