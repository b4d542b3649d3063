"""`quantrack sync --stale` (issue #43, `kill -9` recovery): a RUNNING run whose quantrack process is gone is ended
KILLED with ``quantrack.ended_by`` saying why; a run of a live process, of another host, boot or PID namespace, or
without the process tags is left RUNNING and said. The liveness rule (quantrack.store.liveness) as a pure
function, then against a real store with real processes (this one, and one killed by SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from quantrack.run.schema import Tag
from quantrack.store.liveness import ALIVE, GONE, UNKNOWN, Here, here, process_state, process_tags

ME = Here("node-a", "boot-1", "pid:[1]")


def _tags(**over: str) -> dict[str, str]:
    base = {Tag.HOSTNAME: "node-a", Tag.BOOT_ID: "boot-1", Tag.PID_NAMESPACE: "pid:[1]", Tag.PID: "4242",
            Tag.PID_START: "1000.00"}
    base.update(over)
    return {k: v for k, v in base.items() if v != "-"}


def test_a_process_that_is_gone() -> None:
    state, why = process_state(_tags(), ME, lambda _pid: (False, None, False))
    assert (state, why) == (GONE, "process 4242 on node-a is gone")


def test_a_live_process_is_left() -> None:
    assert process_state(_tags(), ME, lambda _pid: (True, 1000.3, False))[0] == ALIVE
    # exists but its start time cannot be read (another user's process): left alone
    assert process_state(_tags(), ME, lambda _pid: (True, None, False))[0] == ALIVE


def test_a_reused_pid_or_a_zombie_is_gone() -> None:
    state, why = process_state(_tags(), ME, lambda _pid: (True, 5000.0, False))
    assert state == GONE and "now another process" in why
    assert process_state(_tags(), ME, lambda _pid: (True, 1000.0, True))[0] == GONE


@pytest.mark.parametrize(("over", "said"), [
    ({Tag.HOSTNAME: "node-b"}, "its host 'node-b' is not this host ('node-a')"),
    ({Tag.BOOT_ID: "boot-0"}, "boot boot-0 of a host named 'node-a'"),
    ({Tag.BOOT_ID: "unknown"}, "boot unknown"),
    ({Tag.PID_NAMESPACE: "pid:[2]"}, "PID namespace pid:[2]"),
    ({Tag.PID: "-"}, "no quantrack.pid tag"),
    ({Tag.HOSTNAME: "-"}, "no quantrack.hostname tag"),
    ({Tag.PID: "12x"}, "is not a pid"),
])
def test_what_cannot_be_placed_is_unknown_and_never_probed(over: dict[str, str], said: str) -> None:
    def probe(_pid: int) -> tuple[bool, float | None, bool]:
        raise AssertionError("a process of another host or boot is never looked up here")

    state, why = process_state(_tags(**over), ME, probe)
    assert state == UNKNOWN and said in why, why


def test_this_process_and_a_killed_one_for_real() -> None:
    mine = process_tags()
    assert mine[Tag.PID] == str(os.getpid()) and mine[Tag.HOSTNAME] == here().hostname
    assert process_state(mine) == (ALIVE, f"process {os.getpid()} on {here().hostname} is alive")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    theirs = {**mine, Tag.PID: str(child.pid)}
    from quantrack.store.liveness import start_time

    theirs[Tag.PID_START] = f"{start_time(child.pid):.2f}"
    assert process_state(theirs)[0] == ALIVE
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert process_state(theirs) == (GONE, f"process {child.pid} on {here().hostname} is gone")


# --- against a real store, through the CLI ---------------------------------------------------------------


def _cli(args: list[str]) -> int:
    from quantrack.cli import main

    try:
        return int(main(args) or 0)
    except SystemExit as exc:
        return int(exc.code or 0)


def _running(uri: str, name: str, tags: dict[str, str]) -> str:
    from quantrack.store.records import RunRecord
    from quantrack.store.tracking import Tracker

    rec = RunRecord(experiment="stale", run_name=name, status="RUNNING")
    for k, v in tags.items():
        rec.tag(k, v)
    logged = Tracker(uri, "stale").log(rec)
    assert logged.run_id is not None
    return logged.run_id


def test_sync_stale_ends_only_the_run_whose_process_is_gone(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mine = process_tags()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # exited and reaped: its pid names no process
    dead = _running(uri, "study:dead", {**mine, Tag.PID: str(child.pid)})
    alive = _running(uri, "study:alive", mine)
    other = _running(uri, "study:other-host", {**mine, Tag.HOSTNAME: "not-" + mine[Tag.HOSTNAME]})
    bare = _running(uri, "study:no-tags", {})
    assert _cli(["sync", "--stale", "--tracking-uri", uri]) == 0
    out = capsys.readouterr()
    client = mlflow.MlflowClient(uri)
    runs = {r: client.get_run(r) for r in (dead, alive, other, bare)}
    assert runs[dead].info.status == "KILLED"
    assert runs[dead].data.tags[Tag.ENDED_BY].startswith(f"sync --stale: process {child.pid} on ")
    for r in (alive, other, bare):
        assert runs[r].info.status == "RUNNING" and Tag.ENDED_BY not in runs[r].data.tags
    assert "stale: ended KILLED 1 (process gone), left RUNNING 1 (process alive) and 2 (unknown" in out.out
    assert f"ended study:dead ({dead}, experiment 'stale') KILLED: process {child.pid}" in out.err
    assert f"left study:other-host ({other}, experiment 'stale') RUNNING: unknown whether its process is gone" \
        in out.err
    # a second pass finds nothing more to end
    assert _cli(["sync", "--stale", "--tracking-uri", uri]) == 0
    assert "stale: ended KILLED 0" in capsys.readouterr().out


def test_sync_stale_on_a_store_that_is_not_there_is_one_line_and_no_store(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "none" / "mlflow.db"
    assert _cli(["sync", "--stale", "--tracking-uri", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no tracking store at" in err and not db.exists()


def test_the_writers_identity_is_set_when_the_run_is_created(tmp_path: Path) -> None:
    """A process killed before an upload's tag batch still leaves a run that names its writer."""
    import mlflow

    from quantrack.store import tracking
    from quantrack.store.records import RunRecord

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = tracking._client(uri)
    exp = tracking.experiment_id(client, "stale", uri)
    rec = RunRecord(experiment="stale", run_name="arm", status="FINISHED")
    for k, v in process_tags().items():
        rec.tag(k, v)

    class Killed(Exception):
        pass

    real = tracking._log_batch

    def log_batch(*a: object, **k: object) -> None:
        raise Killed  # the process dies at its first batch (params)

    def delete_run(_run_id: str) -> None:
        raise Killed  # nor does a killed process delete what it created

    client.delete_run = delete_run
    tracking._log_batch = log_batch  # type: ignore[assignment]
    try:
        with pytest.raises(Killed):
            tracking.upload(client, exp, rec, None)
    finally:
        tracking._log_batch = real
    (run,) = mlflow.MlflowClient(uri).search_runs([exp])
    assert run.info.status == "RUNNING" and run.data.tags[Tag.PID] == str(os.getpid())
    assert process_state(dict(run.data.tags))[0] == ALIVE
