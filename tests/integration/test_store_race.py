"""Two (and three) `quantrack` processes on one fresh SQLite store at once (issue #30): MlflowClient creates and
migrates the store on first use, and two processes doing it together raced ("table experiments already
exists"), refusing one run. quantrack creates the store under a file lock (and retries a race); every process's
runs land. Real processes, a real MLflow SQLite store; they start together on a shared start time."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quantrack.store.tracking import load_runs

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import sys, time
    from quantrack.store.records import RunRecord
    from quantrack.store.tracking import Tracker
    uri, name, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    import mlflow.tracking  # the import (seconds) before the start line, so the store creation overlaps
    time.sleep(max(0.0, start - time.time()))
    t = Tracker(uri, "race")
    parent = t.log(RunRecord(experiment="race", run_name=name, status="RUNNING", tags={"quantrack.role": "study"}))
    rec = RunRecord(experiment="race", run_name=name + "-arm", status="FINISHED", parent_uuid=parent.uuid,
                    tags={"quantrack.role": "arm", "quantrack.arm": name})
    rec.metric("tpot_ms_p50", 1.0)
    arm = t.log(rec)
    t.finish(parent, "FINISHED")
    print(parent.run_id, arm.run_id, parent.spooled, arm.spooled)
""")


@pytest.mark.parametrize("n", [2, 3])
def test_concurrent_processes_on_a_fresh_sqlite_store_all_land(tmp_path: Path, n: int) -> None:
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    start = time.time() + 12.0  # every process has imported mlflow by then (a loaded 2-core machine)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "QUANTRACK_SPOOL_DIR": str(tmp_path / "spool"),
           "HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, uri, f"p{i}", str(start)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env) for i in range(n)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        _parent_id, _arm_id, parent_spooled, arm_spooled = out.split()
        assert parent_spooled == arm_spooled == "None", out  # logged to the store, not spooled
    arms = load_runs("race", uri)
    assert sorted(r.arm for r in arms) == [f"p{i}" for i in range(n)]
    assert all(r.status == "FINISHED" for r in arms)
    assert not (tmp_path / "spool").exists()
