"""The shared tracking server goes away mid-study: the next arm is spooled locally, `quantrack sync` uploads
it later, and the run on the server is identical (params, metrics with steps, tags, status, times, artifacts).
Sync is idempotent. Arms are logged from real H200 files (../shared/data/vllm-h200)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.runner import ArmOutcome, load_latency_row, record_for_arm, study_record
from quantrack.store.tracking import TAG_SPOOLED, Tracker, pending_spool, spool_dir
from quantrack.study import load_study
from tests.integration.mlflow_fixtures import MlflowServer, free_port, run_fields

pytestmark = pytest.mark.integration
STUDY = Path(__file__).resolve().parents[1] / "data" / "tracking" / "vllm-h200.toml"


def _outcome(study, arm: str, d: Path) -> ArmOutcome:  # type: ignore[no-untyped-def]
    from quantrack.engines import get_adapter

    out = ArmOutcome(arm=study.arm(arm), status="FINISHED", source="log", node={"hostname": "node-a"})
    out.latency_row = load_latency_row(d / f"client-latency-{arm}.json")
    out.server_log = d / f"vllm-0.25.0-{arm}.log"
    out.log_report = get_adapter("vllm").parse_log_file(out.server_log)
    return out


def test_outage_spool_sync_identical(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = shared_data / "vllm-h200"
    study = load_study(STUDY)
    exp = study.name
    port = free_port()
    backend, arts = f"sqlite:///{tmp_path}/server.db", tmp_path / "artifacts"
    srv = MlflowServer(backend, arts, tmp_path / "server.log", port=port).start()
    try:
        tracker = Tracker(srv.url, exp)
        parent = tracker.log(study_record(study, exp, {"hostname": "node-a"}))
        assert parent.run_id is not None
        first = tracker.log(record_for_arm(study, _outcome(study, "bf16", d), experiment=exp, parent_uuid=parent.uuid))
        assert first.run_id is not None
    finally:
        srv.stop()

    # mid-study outage: the fp8 arm and the parent's final status go to the spool, quickly
    rec = record_for_arm(study, _outcome(study, "fp8", d), experiment=exp, parent_uuid=parent.uuid)
    rec.series("sample_tpot_ms", [3.44, 3.45, 3.43])  # a metric with steps must survive the spool too
    t0 = time.monotonic()
    spooled = tracker.log(rec)
    tracker.finish(parent, "FINISHED")
    assert spooled.run_id is None and spooled.spooled is not None and time.monotonic() - t0 < 20
    assert [p.name for p in pending_spool()] == [rec.uuid]
    on_disk = json.loads((spooled.spooled / "record.json").read_text())
    assert on_disk["target_uri"] == srv.url and on_disk["status"] == "FINISHED"

    # server back (same store, same port): sync uploads; a second sync changes nothing
    srv = MlflowServer(backend, arts, tmp_path / "server2.log", port=port).start()
    try:
        assert main(["sync"]) is None
        out = capsys.readouterr().out
        assert out.startswith("uploaded 1, already there 0, statuses set 1, left in ")
        runs = {r["info"]["run_name"]: r for r in srv.search_runs(exp)}
        assert set(runs) == {"study:vllm-h200-llama8b", "bf16", "fp8"}
        got = run_fields(runs["fp8"])
        want = rec.redacted()
        assert got["status"] == "FINISHED" and got["start_time"] == want.start_ms and got["end_time"] == want.end_ms
        assert got["params"] == want.params
        assert got["metrics"] == want.latest_metrics()
        tags = dict(got["tags"])
        assert tags.pop(TAG_SPOOLED) == "true"
        assert tags["mlflow.parentRunId"] == parent.run_id
        for k, v in want.tags.items():
            assert tags[k] == v, k
        hist = srv.metric_history(runs["fp8"]["info"]["run_id"], "sample_tpot_ms")
        assert [(h["step"], h["value"]) for h in hist] == [(0, 3.44), (1, 3.45), (2, 3.43)]
        assert srv.list_artifacts(runs["fp8"]["info"]["run_id"]) == [
            "latency/latency.json", "server/log_report.json", "server/vllm-0.25.0-fp8.log"]
        assert run_fields(runs["study:vllm-h200-llama8b"])["status"] == "FINISHED"
        # the uploaded server log is byte-identical to the real one (it has no secrets to redact)
        assert (spool_dir() / "synced" / rec.uuid / "artifacts" / "server" / "vllm-0.25.0-fp8.log").read_bytes() \
            == (d / "vllm-0.25.0-fp8.log").read_bytes()

        assert main(["sync"]) is None
        assert capsys.readouterr().out.startswith("uploaded 0, already there 0, statuses set 0")
        # a spooled entry whose upload already happened (e.g. the move after upload was interrupted) is skipped
        (spool_dir() / "synced" / rec.uuid).rename(spool_dir() / "pending" / rec.uuid)
        assert main(["sync"]) is None
        assert capsys.readouterr().out.startswith("uploaded 0, already there 1")
        assert len(srv.search_runs(exp)) == 3
    finally:
        srv.stop()


def test_sync_with_server_down_keeps_everything(shared_data: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    study = load_study(STUDY)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    logged = Tracker(url, study.name).log(record_for_arm(study, _outcome(study, "fp8kv", shared_data / "vllm-h200"),
                                                         experiment=study.name))
    assert logged.spooled is not None
    with pytest.raises(SystemExit) as exc:
        main(["sync"])
    assert exc.value.code == 1
    assert "unreachable" in capsys.readouterr().err
    assert [p.name for p in pending_spool()] == [logged.uuid]
