"""`compare` rendering against golden files, from runs logged into this test's own temporary store.

The runs are logged from real files only: the vLLM H200 logs and latency JSON in ../shared/data/vllm-h200
and real per-question GSM8K records captured from llama.cpp (tests/data/eval/smol-q41-*.jsonl, see its
README). Regenerate the golden files with QUANTRACK_UPDATE_GOLDEN=1 after an intended change.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from quantrack.errors import BadInput, did_you_mean
from quantrack.report.compare import (
    FILL,
    NO_RECORDS,
    build_table,
    compare_experiment,
    render,
)
from quantrack.runner import LogInputs, log_results
from quantrack.storeread import read_runs
from quantrack.study import load_study
from quantrack.tracking import RunRow, load_runs

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN = DATA / "golden"
STUDY = DATA / "tracking" / "vllm-h200.toml"
EXPERIMENT = "vllm-h200-llama8b"


@pytest.fixture(scope="module")
def store_uri(shared_data_module: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Four arms logged with `quantrack log`'s library call into a fresh SQLite store."""
    store = tmp_path_factory.mktemp("compare-store")
    uri = f"sqlite:///{store}/mlflow.db"
    study = load_study(STUDY)
    d = shared_data_module / "vllm-h200"
    ev = {"bf16": DATA / "eval" / "smol-q41-max24.jsonl", "fp8": DATA / "eval" / "smol-q41-lmeval.jsonl"}
    for arm in ("bf16", "fp8", "fp8kv", "fp8marlin"):
        latency = d / f"client-latency-{arm}.json" if arm != "fp8marlin" else None
        log_results(LogInputs(study=study, arm=arm, latency=latency, eval=ev.get(arm),
                              server_log=d / f"vllm-0.25.0-{arm}.log", tracking_uri=uri))
    return uri


@pytest.fixture(scope="module")
def logged(store_uri: str) -> list[RunRow]:
    return load_runs(EXPERIMENT, store_uri)


@pytest.fixture(scope="module")
def shared_data_module() -> Path:
    from tests.conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


def _normalize(text: str) -> str:
    return re.sub(r"\b[0-9a-f]{32}\b", "<run_id>", text)


@pytest.mark.parametrize("fmt,ext", [("table", "txt"), ("md", "md"), ("csv", "csv"), ("json", "json")])
def test_golden(logged: list[RunRow], fmt: str, ext: str) -> None:
    text = _normalize(render(build_table(EXPERIMENT, logged), fmt))
    golden = GOLDEN / f"compare-vllm-h200.{ext}"
    if os.environ.get("QUANTRACK_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def test_values_come_from_the_files(logged: list[RunRow]) -> None:
    rows = {r["arm"]: r for r in build_table(EXPERIMENT, logged).rows}
    # vllm-0.25.0-bf16.log: "Model loading took 14.96 GiB", "GPU KV cache size: 920,192 tokens"
    assert rows["bf16"]["weights_gib"] == "14.96" and rows["bf16"]["capacity_tok"] == "920,192"
    # client-latency-fp8.json batch1.tpot_ms = 3.442...
    assert rows["fp8"]["tpot_ms"] == "3.44 ms"
    assert rows["fp8marlin"]["fallback"] == "yes (fp8_marlin)" and rows["fp8"]["fallback"] == "no"
    # no eval given for fp8kv / fp8marlin: never filled from elsewhere
    assert rows["fp8kv"]["gsm8k"] == FILL and rows["fp8kv"]["delta"] == FILL
    assert rows["fp8marlin"]["tpot_ms"] == FILL
    # the real records: 0 of 8 (max24) and 0 of 6 (lm-eval) correct -> McNemar over the shared answered ids
    assert rows["bf16"]["gsm8k"] == "0.000 ± 0.000"
    assert rows["fp8"]["delta"] == "+0.0 pts"
    assert rows["fp8"]["paired_test"].startswith("McNemar p=1 (n=")
    assert rows["bf16"]["top1_agree"] == FILL and rows["bf16"]["kl"] == FILL


def test_no_records_marker(logged: list[RunRow]) -> None:
    runs = [RunRow(**{**r.__dict__, "tags": {k: v for k, v in r.tags.items() if k != "quantrack.gsm8k_correct"}})
            for r in logged]
    rows = {r["arm"]: r for r in build_table(EXPERIMENT, runs).rows}
    assert rows["fp8"]["paired_test"] == NO_RECORDS


def test_baseline_choice(logged: list[RunRow]) -> None:
    t = build_table(EXPERIMENT, logged, baseline="fp8")
    assert t.rows[0]["arm"] == "fp8" and t.rows[0]["delta"] == "— (baseline)"
    assert "Δ vs fp8" in t.headers()
    with pytest.raises(BadInput, match=r"--baseline 'fp9' is not an arm of this experiment \(did you mean 'fp8'\?\)"):
        build_table(EXPERIMENT, logged, baseline="fp9")


def test_compare_experiment_and_unknown(store_uri: str) -> None:
    uri = store_uri
    t = compare_experiment(EXPERIMENT, None, uri)
    assert [r["arm"] for r in t.rows] == ["bf16", "fp8", "fp8kv", "fp8marlin"]
    with pytest.raises(BadInput, match="unknown experiment 'vllm-h200-llama9b'"):
        compare_experiment("vllm-h200-llama9b", None, uri)


def test_json_labels(logged: list[RunRow]) -> None:
    data = json.loads(render(build_table(EXPERIMENT, logged), "json"))
    sources = {c["key"]: c["source"] for c in data["columns"]}
    assert sources["predicted_tok"].startswith("derived") and sources["capacity_tok"].startswith("measured")
    assert data["values"][0]["metrics"]["kv_tokens_reported"] == 920192


def test_bad_format(logged: list[RunRow]) -> None:
    with pytest.raises(BadInput, match=r"unknown --format 'tabel' \(did you mean 'table'\?\)"):
        render(build_table(EXPERIMENT, logged), "tabel")


# --- the direct read path (quantrack.storeread) against mlflow's own reading of the same store --------------

def _same_rows(a: list[RunRow], b: list[RunRow]) -> None:
    """Equal field by field, NaN metrics included (nan != nan)."""
    assert [r.run_id for r in a] == [r.run_id for r in b]
    for x, y in zip(a, b):
        fix = {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in x.metrics.items()}
        fiy = {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in y.metrics.items()}
        assert ({**x.__dict__, "metrics": fix}) == ({**y.__dict__, "metrics": fiy})


def test_direct_read_renders_byte_identical(store_uri: str) -> None:
    direct = read_runs(store_uri, EXPERIMENT, "arm", lambda names: AssertionError(names))
    assert direct is not None, "the sqlite store was not read directly (schema guard fell back)"
    via_mlflow = load_runs(EXPERIMENT, store_uri, reader="mlflow")
    assert len(direct) == 4
    _same_rows(direct, via_mlflow)
    for fmt in ("table", "md", "csv", "json"):
        assert render(build_table(EXPERIMENT, direct), fmt) == render(build_table(EXPERIMENT, via_mlflow), fmt)
    # audit --experiment reads through the same loader
    from quantrack.report import audit as audit_mod

    assert audit_mod.render(audit_mod.audit([EXPERIMENT], uri=store_uri), "json") == audit_mod.render(
        audit_mod.build_audit(via_mlflow), "json")


def test_fresh_process_compare_never_imports_mlflow(store_uri: str) -> None:
    """What a user runs: a new interpreter renders the same bytes as the mlflow client path, without mlflow."""
    code = ("import sys; from quantrack.report.compare import compare_experiment, render; "
            f"sys.stdout.write(render(compare_experiment({EXPERIMENT!r}, None, {store_uri!r}), 'table')); "
            "sys.stderr.write('mlflow imported' if 'mlflow' in sys.modules else 'no mlflow')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stderr.strip().splitlines()[-1] == "no mlflow"
    assert out.stdout == render(build_table(EXPERIMENT, load_runs(EXPERIMENT, store_uri, reader="mlflow")), "table")


def test_unknown_experiment_same_message_both_ways(store_uri: str) -> None:
    msgs = []
    for reader in ("auto", "mlflow"):
        with pytest.raises(BadInput) as exc:
            load_runs("vllm-h200-llama9b", store_uri, reader=reader)
        msgs.append(str(exc.value))
    assert msgs[0] == msgs[1] == "unknown experiment 'vllm-h200-llama9b' (did you mean 'vllm-h200-llama8b'?)"
    with pytest.raises(BadInput, match=r"unknown store reader 'sql'; readers: auto, mlflow"):
        load_runs(EXPERIMENT, store_uri, reader="sql")


@pytest.fixture(scope="module")
def edge_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Cases mlflow's search decides: a deleted run, tied start times, a role tag in another case, no role
    tag, a NaN metric, a run with no end time, a deleted experiment of the same store."""
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('edge-store')}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("edge")
    c.delete_experiment(c.create_experiment("gone"))

    def run(name: str, start: int, role: str | None, status: str | None = "FINISHED") -> str:
        tags = {"quantrack.role": role} if role else {}
        rid = c.create_run(exp, start_time=start, tags=tags, run_name=name).info.run_id
        c.log_batch(rid, metrics=[Metric("tpot_ms_p50", 3.5, 1, 0), Metric("tpot_ms_p50", 4.25, 2, 0)],
                    params=[], tags=[RunTag("quantrack.arm", name)])
        if status:
            c.set_terminated(rid, status, end_time=start + 5)
        return rid

    run("a", 1000, "arm")
    run("b", 1000, "arm")  # same start: mlflow breaks the tie by run id
    run("c", 3000, "arm", status=None)  # still RUNNING, no end time
    c.delete_run(run("d", 4000, "arm"))  # deleted: not searched
    run("e", 2000, "Arm")  # '=' is case-sensitive
    run("f", 500, None)
    nan = run("g", 2500, "arm", status="FAILED")
    c.log_metric(nan, "kl_mean", float("nan"))
    return uri


@pytest.mark.parametrize("role", ["arm", None])
def test_direct_read_follows_mlflow_search_rules(edge_store: str, role: str | None) -> None:
    direct = read_runs(edge_store, "edge", role, lambda names: AssertionError(names))
    assert direct is not None
    via_mlflow = load_runs("edge", edge_store, role=role, reader="mlflow")
    _same_rows(direct, via_mlflow)
    names = [r.run_name for r in direct]
    want = ["c", "g", "e", *sorted(["a", "b"], key=lambda n: next(r.run_id for r in direct if r.run_name == n)),
            "f"]
    assert names == (want if role is None else [n for n in want if n not in ("e", "f")])
    g = next(r for r in direct if r.run_name == "g")
    assert math.isnan(g.metrics["kl_mean"]) and g.metrics["tpot_ms_p50"] == 4.25  # latest = highest step
    assert next(r for r in direct if r.run_name == "c").end_time is None
    assert [r.run_name for r in load_runs("edge", edge_store, role=role, include_running=False)] == \
        [n for n in names if n != "c"]


def test_unknown_schema_falls_back_and_never_writes(edge_store: str, tmp_path: Path) -> None:
    src = Path(edge_store[len("sqlite:///"):])
    db = tmp_path / "copy.db"
    db.write_bytes(src.read_bytes())
    uri = f"sqlite:///{db}"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    conn.close()
    assert read_runs(uri, "edge", "arm", lambda names: AssertionError(names)) is None
    missing = tmp_path / "none" / "mlflow.db"
    assert read_runs(f"sqlite:///{missing}", "edge", "arm", lambda names: AssertionError(names)) is None
    assert not missing.exists()  # opened read-only: never created (mlflow would create and migrate it)


def test_rest_read_matches_mlflow(store_uri: str, edge_store: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The REST reader against mlflow server's own request handlers (in-process WSGI: no socket)."""
    import httpx
    from mlflow.server import app, handlers
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    for uri, exp in ((store_uri, EXPERIMENT), (edge_store, "edge")):
        monkeypatch.setattr(handlers, "_tracking_store", SqlAlchemyStore(uri, str(tmp_path / "art")))
        transport = httpx.WSGITransport(app=app)
        rest = read_runs("http://127.0.0.1:5000", exp, "arm", lambda names: AssertionError(names), transport)
        assert rest is not None
        _same_rows(rest, load_runs(exp, uri, reader="mlflow"))
    with pytest.raises(BadInput, match=r"unknown experiment 'edg' \(did you mean 'edge'\?\)"):
        read_runs("http://127.0.0.1:5000", "edg", "arm", lambda names: BadInput(
            f"unknown experiment 'edg'{did_you_mean('edg', names)}"), transport)
