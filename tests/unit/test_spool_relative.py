"""`quantrack sync` from a relative spool folder (issue #43, "finished work lost" (c)): a relative
``$QUANTRACK_SPOOL_DIR`` is resolved once, so an entry's artifact paths are absolute and never joined onto
themselves; sync works from another working directory; an upload that fails half-way leaves no run in the store,
and the next sync uploads one copy, never a second."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.run.schema import Tag
from quantrack.store import tracking
from quantrack.store.records import RunRecord


def _cli(args: list[str]) -> int:
    from quantrack.cli import main

    try:
        return int(main(args) or 0)
    except SystemExit as exc:
        return int(exc.code or 0)


def _spooled(tmp: Path, uri: str) -> RunRecord:
    """An arm's record with a text artifact and a file artifact (an engine log), spooled."""
    (tmp / "engine.log").write_text("engine says hello\n", encoding="utf-8")
    rec = RunRecord(experiment="relspool", run_name="arm-a", status="FINISHED")
    rec.metric("tpot_ms_p50", 12.5)
    rec.artifacts["latency/latency.json"] = '{"n_ok": 3}'
    rec.artifact_files["server/engine.log"] = "engine.log"  # relative to the working directory, as a workdir is
    tracking.spool_record(rec, uri, "tracking store refused it (test)")
    return rec


def _active_runs(uri: str, run_uuid: str) -> list[object]:
    import mlflow

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("relspool")
    if exp is None:
        return []
    return list(client.search_runs([exp.experiment_id], filter_string=f"tags.`{Tag.RUN_UUID}` = '{run_uuid}'"))


def test_the_spool_folder_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", "rel/spool")
    assert tracking.spool_dir() == tmp_path / "rel" / "spool"
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", "rel/../other")
    assert tracking.spool_dir() == tmp_path / "other"


def test_sync_from_a_relative_spool_and_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", "spool")
    rec = _spooled(tmp_path, uri)
    entry = tmp_path / "spool" / "pending" / rec.uuid
    assert (entry / "record.json").is_file()
    # sync from a sub-folder, naming the same spool folder relative to it
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", "../spool")
    assert _cli(["sync"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert out.out.startswith("uploaded 1, already there 0") and f"left in {tmp_path / 'spool'}: 0" in out.out
    (run,) = _active_runs(uri, rec.uuid)
    assert run.info.status == "FINISHED" and run.data.tags[Tag.COMPLETE] == "true"  # type: ignore[attr-defined]
    text = tracking.read_artifact_text(run.info.run_id, "server/engine.log", uri)  # type: ignore[attr-defined]
    assert text == "engine says hello\n"
    assert tracking.read_artifact_text(run.info.run_id, "latency/latency.json", uri) == '{"n_ok": 3}'  # type: ignore[attr-defined]
    assert not entry.exists() and (tmp_path / "spool" / "synced" / rec.uuid).is_dir()
    # a second sync: nothing pending, still one copy
    assert _cli(["sync"]) == 0
    assert capsys.readouterr().out.startswith("uploaded 0, already there 0")
    assert len(_active_runs(uri, rec.uuid)) == 1


def test_an_upload_that_fails_half_way_leaves_nothing_and_the_next_sync_makes_one_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", "spool")
    rec = _spooled(tmp_path, uri)
    real = tracking._materialize

    def broken(*_a: object, **_k: object) -> None:  # the artifacts cannot be written (full disk, a bad path)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking, "_materialize", broken)
    assert _cli(["sync"]) == 1
    assert f"not synced {rec.uuid[:8]}: OSError" in capsys.readouterr().err
    assert _active_runs(uri, rec.uuid) == []  # the run it had created is gone: no half copy in the store
    monkeypatch.setattr(tracking, "_materialize", real)
    assert _cli(["sync"]) == 0
    assert capsys.readouterr().out.startswith("uploaded 1")
    (run,) = _active_runs(uri, rec.uuid)
    assert run.data.metrics["tpot_ms_p50"] == 12.5  # type: ignore[attr-defined]
