"""`quantrack verify` on the committed stores: every one passes, and a copy with one figure altered fails naming it.

The stores are the ones the docs quote (docs/gpu/*-store*.tar.gz, docs/cpu-qwen-store.tar.gz): SQLite MLflow stores
with their artifacts beside the database (``<db dir>/artifacts/<run id>/artifacts``), extracted to a temp folder.
"""

from __future__ import annotations

import shutil
import sqlite3
import tarfile
from pathlib import Path

import pytest

from quantrack.cli import main

REPO = Path(__file__).resolve().parents[2]
STORES = sorted((REPO / "docs" / "gpu").glob("*store*.tar.gz")) + [REPO / "docs" / "cpu-qwen-store.tar.gz"]
SKIP_EXPERIMENTS = ("Default", "quantrack-node-facts")


def _extract(tar: Path, dest: Path) -> Path:
    with tarfile.open(tar) as tf:
        tf.extractall(dest, filter="data")
    dbs = sorted(dest.rglob("mlflow.db"))
    assert len(dbs) == 1, f"{tar.name}: {dbs}"
    return dbs[0]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Store name -> its mlflow.db, each extracted once for the module."""
    root = tmp_path_factory.mktemp("committed-stores")
    return {t.name: _extract(t, root / t.name.removesuffix(".tar.gz")) for t in STORES}


def _experiments(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        names = [r[0] for r in con.execute("select name from experiments order by name")]
    return [n for n in names if n not in SKIP_EXPERIMENTS]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
        code = 0 if rc is None else int(rc)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _copy(db: Path, dest: Path) -> Path:
    shutil.copytree(db.parent, dest)
    return dest / db.name


def test_the_committed_stores_are_all_found() -> None:
    assert len(STORES) == 7, [s.name for s in STORES]


def test_every_committed_store_verifies(stores: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0 on every experiment of every store, with figures actually recomputed (not an empty pass)."""
    from quantrack.report.verify import RECOMPUTED, verify_experiment

    seen = 0
    for name, db in stores.items():
        uri = f"sqlite:///{db}"
        for exp in _experiments(db):
            code, out, err = _run(["verify", "--experiment", exp, "--tracking-uri", uri], capsys)
            assert code == 0, f"{name} {exp}: exit {code}\n{out}{err}"
            assert "DISAGREES" not in out and "every figure checked agrees" in out, out
            v = verify_experiment(exp, uri)
            finished = [a for a in v.arms if a.status == "FINISHED"]
            assert finished and all(a.count(RECOMPUTED) >= 20 for a in finished), (name, exp, [
                (a.arm, a.count(RECOMPUTED)) for a in finished])
            seen += 1
    assert seen == 14


def test_gsm8k_and_kl_and_log_figures_are_recomputed(stores: dict[str, Path]) -> None:
    """The headline figures of an arm with records, KL and a log are checked from them, each with its source."""
    from quantrack.report.verify import verify_experiment

    db = stores["h200-qwen2.5-coder-1.5b-store.tar.gz"]
    v = verify_experiment("h200-qwen2.5-coder-1.5b-sglang", f"sqlite:///{db}")
    fp8 = next(a for a in v.arms if a.arm == "fp8" and a.status == "FINISHED")
    by = {c.name: c for c in fp8.checks}
    assert by["gsm8k_correct"].recomputed == 527.0 and by["gsm8k_n"].recomputed == 1319.0
    assert by["gsm8k_correct"].source == "eval/records.jsonl"
    assert by["quantrack.gsm8k_correct"].agrees
    assert "same study run" in by["gsm8k_delta_vs_baseline"].source
    assert by["kl_positions"].recomputed == 4000.0
    assert by["kv_tokens_reported"].recomputed == 884316.0 and "parsed again" in by["kv_tokens_reported"].source
    assert "kl_median" in fp8.unchecked and "per-position" in fp8.unchecked["kl_median"]
    assert all(n in fp8.unchecked for n in ("step_eval_s", "itl_ms_p50", "kv_tokens_predicted"))


def test_a_negative_weight_size_is_said_not_verified(stores: dict[str, Path], capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """SGLang printed a negative 'mem usage' for kv-fp8-e5m2; the store kept -42.46: never called verified."""
    db = stores["h200-qwen2.5-coder-1.5b-store.tar.gz"]
    code, out, _ = _run(["verify", "--experiment", "h200-qwen2.5-coder-1.5b-kv-sglang", "--tracking-uri",
                         f"sqlite:///{db}"], capsys)
    assert code == 0
    assert "the stored figure -42.46 is negative, not a size" in out and "): weights_gib" in out


def _one_run_with(db: Path, metric: str, arm: str) -> tuple[str, str, float]:
    with sqlite3.connect(db) as con:
        row = con.execute(
            "select r.run_uuid, e.name, m.value from latest_metrics m join runs r on r.run_uuid = m.run_uuid "
            "join experiments e on e.experiment_id = r.experiment_id where m.key = ? and r.name = ? "
            "order by r.start_time limit 1", (metric, arm)).fetchone()
    assert row is not None
    return row[0], row[1], float(row[2])


def test_a_metric_altered_in_sqlite_fails_naming_it(stores: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    db = _copy(stores["h200-qwen2.5-coder-1.5b-store.tar.gz"], tmp_path / "store")
    run_id, exp, was = _one_run_with(db, "gsm8k_accuracy", "fp8")
    with sqlite3.connect(db) as con:
        con.execute("update metrics set value = ? where run_uuid = ? and key = 'gsm8k_accuracy'", (was + 0.01, run_id))
        con.execute("update latest_metrics set value = ? where run_uuid = ? and key = 'gsm8k_accuracy'",
                    (was + 0.01, run_id))
    code, out, err = _run(["verify", "--experiment", exp, "--tracking-uri", f"sqlite:///{db}"], capsys)
    assert code == 1, out + err
    bad = [line for line in out.splitlines() if "DISAGREES" in line]
    assert len(bad) == 1, out
    assert bad[0].startswith("  DISAGREES gsm8k_accuracy: stored ")
    assert f"stored {was + 0.01:.10g}, recomputed {was:.10g} (recomputed: eval/records.jsonl)" in bad[0]
    assert "1 figure(s) disagree" in out.splitlines()[-1]


def test_a_metric_logged_again_through_mlflow_fails_naming_it(stores: dict[str, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A later point of a metric (what a hand 'correction' through MLflow's client makes) is caught too."""
    from mlflow.tracking import MlflowClient

    db = _copy(stores["cpu-qwen-store.tar.gz"], tmp_path / "store")
    run_id, exp, was = _one_run_with(db, "tpot_ms_p50", "Q4_0")
    uri = f"sqlite:///{db}"
    MlflowClient(tracking_uri=uri).log_metric(run_id, "tpot_ms_p50", was * 0.9, step=1)
    code, out, _ = _run(["verify", "--experiment", exp, "--tracking-uri", uri, "--format", "json"], capsys)
    assert code == 1
    import json

    doc = json.loads(out)
    bad = [(a["arm"], d["name"], d["stored"], d["recomputed"]) for a in doc["arms"] for d in a["disagree"]]
    assert bad == [("Q4_0", "tpot_ms_p50", pytest.approx(was * 0.9), pytest.approx(was))]
    assert doc["ok"] is False


def test_an_altered_outcome_tag_fails_with_the_position(stores: dict[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = _copy(stores["cpu-qwen-store.tar.gz"], tmp_path / "store")
    with sqlite3.connect(db) as con:
        run_id, value = con.execute("select run_uuid, value from tags where key = 'quantrack.gsm8k_correct' "
                                    "order by run_uuid limit 1").fetchone()
        i = value.index("0")
        con.execute("update tags set value = ? where run_uuid = ? and key = 'quantrack.gsm8k_correct'",
                    (value[:i] + "1" + value[i + 1:], run_id))
    code, out, _ = _run(["verify", "--experiment", "cpu-qwen2.5-coder-0.5b", "--tracking-uri", f"sqlite:///{db}"],
                        capsys)
    assert code == 1
    assert "DISAGREES quantrack.gsm8k_correct: stored " in out
    assert f"first difference at position {i}: stored '1', records '0'" in out


def test_an_unknown_experiment_is_bad_input(stores: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    db = stores["cpu-qwen-store.tar.gz"]
    code, out, err = _run(["verify", "--experiment", "cpu-qwen", "--tracking-uri", f"sqlite:///{db}"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("quantrack: error: unknown experiment 'cpu-qwen'") and len(err.strip().splitlines()) == 1


def test_agreement_is_within_the_stated_tolerance() -> None:
    from quantrack.report.verify import RECOMPUTED, Check

    assert Check("m", 1.0, 1.0 + 5e-7, RECOMPUTED, "x").agrees
    assert not Check("m", 1.0, 1.0 + 5e-6, RECOMPUTED, "x").agrees
    assert Check("m", 0.0, 5e-10, RECOMPUTED, "x").agrees
    assert not Check("t", "101", "100", RECOMPUTED, "x").agrees
