"""Issue #31: 'tracking store sqlite:///…/mlflow.db refused run 'Q4_0': '_MLFLOW_TELEMETRY_SESSION_ID''.

The cause, in MLflow 3.17.2: the first tracked call activates its telemetry client, whose thread fetches a config
from mlflow.org; without a network that thread calls ``_set_telemetry_client(None)``
(mlflow/telemetry/client.py), which pops ``_MLFLOW_TELEMETRY_SESSION_ID`` from ``os.environ``. quantrack's own
thread was walking ``os.environ.items()`` at that moment (``redact.known_secrets``, run for every record), and
``items()`` looks each listed key up again: KeyError, and the arm was refused.

Here: the interleaving reproduced with MLflow's own function (not a thread, so it happens every time); quantrack's
walk survives it; MLflow's telemetry is off in a process that logs through quantrack (and on without it, so the
check can fail); and a store that refuses a run no longer loses the arm: it is spooled."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from quantrack.redact import known_secrets
from quantrack.store.tracking import RunRecord, Tracker, pending_spool

VAR = "_MLFLOW_TELEMETRY_SESSION_ID"


class _TelemetryThreadMidWalk(Mapping[str, str]):
    """``os.environ`` as seen by a thread that lists its keys while MLflow's telemetry thread runs: once the
    keys are listed, the telemetry client is dropped exactly as mlflow.telemetry.client does when its config fetch
    fails."""

    def __iter__(self) -> Iterator[str]:
        from mlflow.telemetry.client import _set_telemetry_client

        keys = iter(os.environ)  # os.environ lists its keys when the walk starts
        yield next(keys)
        _set_telemetry_client(None)  # pops _MLFLOW_TELEMETRY_SESSION_ID from os.environ
        yield from keys

    def __getitem__(self, key: str) -> str:
        return os.environ[key]

    def __len__(self) -> int:
        return len(os.environ)


def _session_variable_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow sets the variable when it is imported; here it is set again, last in os.environ's order."""
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setenv(VAR, "0123456789abcdef")


def test_the_cause_items_of_environ_raise_when_telemetry_unsets_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.telemetry.client import _set_telemetry_client

    _session_variable_last(monkeypatch)
    walk = iter(os.environ.items())  # what quantrack's redaction did before the fix
    next(walk)
    _set_telemetry_client(None)  # MLflow's telemetry thread, its config fetch failed (no network)
    with pytest.raises(KeyError, match=VAR):
        list(walk)
    _session_variable_last(monkeypatch)
    with pytest.raises(KeyError, match=VAR):
        list(_TelemetryThreadMidWalk().items())


def test_redaction_survives_the_telemetry_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    _session_variable_last(monkeypatch)
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    assert "hf_" + "x" * 30 in known_secrets(_TelemetryThreadMidWalk())
    assert VAR not in os.environ


_PROBE = textwrap.dedent("""
    import os, sys
    import mlflow.telemetry.client as tc
    activated = []
    _activate = tc.TelemetryClient.activate
    def activate(self):  # the first tracked call starts the telemetry threads here
        activated.append(1)
        return _activate(self)
    tc.TelemetryClient.activate = activate
    import quantrack.store.tracking as t
    rec = t.RunRecord(experiment="telemetry", run_name="arm")
    rec.metric("tpot_ms_p50", 1.0)
    logged = t.Tracker(sys.argv[1], "telemetry").log(rec)
    assert logged.run_id, logged
    print(os.environ.get("MLFLOW_DISABLE_TELEMETRY"), bool(activated), flush=True)
    os._exit(0)  # no atexit flush of a telemetry queue (the contrast case has one)
""")


def _probe(tmp_path: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTEST_CURRENT_TEST", "CI", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "GITHUB_ACTIONS")}
    clean.update(env)
    proc = subprocess.run([sys.executable, "-c", _PROBE, f"sqlite:///{tmp_path}/mlflow.db"], env=clean,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.slow
def test_mlflow_telemetry_is_off_in_a_process_that_logs_through_quantrack(tmp_path: Path) -> None:
    assert _probe(tmp_path) == "true False"
    # a user who turns it back on gets MLflow's behaviour (and the check above can fail)
    on = _probe(tmp_path, MLFLOW_DISABLE_TELEMETRY="false")
    assert on == "false True", on


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_a_store_that_refuses_a_run_keeps_it_in_the_spool(monkeypatch: pytest.MonkeyPatch,
                                                           _isolated_tracking: Path) -> None:
    from quantrack.store import tracking

    def refuse(*_a: object, **_k: object) -> str:
        raise KeyError(VAR)

    patch = pytest.MonkeyPatch()
    patch.setattr(tracking, "upload", refuse)
    said: list[str] = []
    rec = RunRecord(experiment="refused", run_name="Q4_0", params={"weights": "q4_0"})
    rec.metric("tpot_ms_p50", 3.97)
    logged = Tracker(None, "refused", progress=said.append).log(rec)
    assert logged.run_id is None and logged.spooled is not None
    assert logged.reason is not None and "refused it: KeyError" in logged.reason and VAR in logged.reason
    assert [p.name for p in pending_spool()] == [rec.uuid]
    assert "spooled run 'Q4_0'" in said[0] and "quantrack sync" in said[0]
    # and sync puts it in the store once the store takes it
    patch.undo()
    from quantrack.store.tracking import load_runs, sync_spool

    result = sync_spool()
    assert result.uploaded == [rec.uuid], result
    rows = load_runs("refused", role=None)
    assert [r.metrics.get("tpot_ms_p50") for r in rows] == [3.97]
