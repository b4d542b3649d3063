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
from quantrack.store.direct import read_runs
from quantrack.store.records import RunRow
from quantrack.store.tracking import load_runs
from quantrack.study import load_study

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
def shared_data_module(real_data: Path) -> Path:
    return real_data


def _normalize(text: str) -> str:
    return re.sub(r"\b[0-9a-f]{32}\b", "<run_id>", text)


@pytest.mark.parametrize("fmt,ext", [("table", "txt"), ("md", "md"), ("csv", "csv"), ("json", "json")])
def test_golden(logged: list[RunRow], fmt: str, ext: str) -> None:
    text = _normalize(render(build_table(EXPERIMENT, logged), fmt, wide=True))
    golden = GOLDEN / f"compare-vllm-h200.{ext}"
    if os.environ.get("QUANTRACK_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def test_default_table_fits_120_columns_golden(logged: list[RunRow]) -> None:
    """The default table: decision columns only, merged cells, baseline cells '— (baseline)', ≤ 120 wide."""
    text = _normalize(render(build_table(EXPERIMENT, logged)))
    golden = GOLDEN / "compare-vllm-h200-narrow.txt"
    if os.environ.get("QUANTRACK_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")
    assert max(len(line) for line in text.splitlines()) <= 120
    base = next(line for line in text.splitlines() if line.startswith("bf16 "))
    assert base.count("— (baseline)") == 2  # Δ and top-1/KL: the baseline is not "not measured"
    assert "All columns: --wide." in text


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
    # the real records: 0 of 8 (max24) and 0 of 6 (lm-eval) correct -> McNemar over the shared answered ids.
    # At 0/n the standard error is 0 and says nothing: the cell is the 95% Wilson interval with n
    # (upper bound z^2 / (n + z^2): 3.8415 / 11.8415 = 32.4% at n=8, 3.8415 / 9.8415 = 39.0% at n=6)
    assert rows["bf16"]["gsm8k"] == "0.0% [0.0, 32.4] n=8"
    assert rows["fp8"]["gsm8k"] == "0.0% [0.0, 39.0] n=6"
    assert rows["fp8"]["delta"] == "+0.0 pts (paired n=6)"  # bf16 answered 8 questions, fp8 6: Δ on the 6 both answered
    assert rows["fp8"]["paired_test"].startswith("McNemar p=1 (n=")
    assert rows["bf16"]["top1_agree"] == rows["bf16"]["kl"] == "— (baseline)"  # not "not measured"
    assert rows["fp8"]["top1_agree"] == FILL and rows["fp8"]["kl"] == FILL


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


# --- the direct read path (quantrack.store.direct) against mlflow's own reading of the same store --------------

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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
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


# --- GSM8K interval, KV MiB, cost, skipped runs, exact McNemar without scipy ---------------------------------

def test_gsm8k_cell_wilson_at_zero_of_ten() -> None:
    from dataclasses import replace

    from quantrack.accuracy.stats import proportion
    from quantrack.report.armrun import Accuracy
    from quantrack.report.compare import gsm8k_cell

    pr = proportion(0, 10)  # what the runner logs as gsm8k_ci_low / gsm8k_ci_high
    assert pr.se == 0.0
    none = Accuracy(None, None, None, None, None, None, None, None)
    acc = replace(none, accuracy=0.0, se=0.0, ci_low=pr.ci_low, ci_high=pr.ci_high, n=10.0)
    assert gsm8k_cell(acc) == "0.0% [0.0, 27.8] n=10"
    # an import with no interval keeps accuracy ± SE; nothing logged is FILL IN
    assert gsm8k_cell(replace(none, accuracy=0.5, se=0.05)) == "0.500 ± 0.050"
    assert gsm8k_cell(none) == FILL


@pytest.mark.parametrize("b,c", [(0, 0), (0, 1), (1, 0), (3, 3), (2, 11), (11, 2), (30, 45), (79, 2), (0, 12),
                                 (140, 170)])
def test_exact_mcnemar_matches_scipy(b: int, c: int) -> None:
    from scipy.stats import binomtest

    from quantrack.accuracy.stats import compare_counts

    pc = compare_counts(50, b, c, 7)
    want = 1.0 if b + c == 0 else binomtest(b, b + c, 0.5).pvalue
    assert pc.mcnemar_p == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_wilson_interval_matches_scipy() -> None:
    from scipy.stats import binomtest, norm

    from quantrack.accuracy.stats import Z_975, proportion

    assert Z_975 == pytest.approx(norm.ppf(0.975), rel=1e-15)
    for k, n in [(0, 10), (1, 10), (5, 10), (10, 10), (0, 8), (617, 1319), (1319, 1319)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        pr = proportion(k, n)
        assert (pr.ci_low, pr.ci_high) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))


def test_fresh_process_compare_never_imports_scipy(store_uri: str, logged: list[RunRow]) -> None:
    """The store has per-question records for bf16 and fp8, so the paired test runs: still no scipy."""
    assert build_table(EXPERIMENT, logged).rows[1]["paired_test"].startswith("McNemar p=")
    code = ("import sys; from quantrack.cli import main\n"
            "try:\n"
            f"    main(['compare', '--experiment', {EXPERIMENT!r}, '--tracking-uri', {store_uri!r}, '--wide'])\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "sys.stderr.write(' '.join(m for m in ('scipy', 'mlflow', 'pandas') if m in sys.modules) or 'none')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stderr.strip().splitlines()[-1] == "none"
    assert "McNemar p=1 (n=6)" in out.stdout


def _prices_file(tmp_path: Path, usd: float) -> Path:
    """A user's --prices file (the shipped table has no H200 price). The rate is a test input, not a quote."""
    f = tmp_path / "prices.toml"
    f.write_text(f"""[[price]]
gpu = "H200"
usd_per_hour = {usd}
date = "2026-11-30"
source = "test input: tests/unit/test_compare_render.py"
""", encoding="utf-8")
    return f


def test_cost_column_at_highest_sweep_concurrency(logged: list[RunRow], shared_data_module: Path,
                                                  tmp_path: Path) -> None:
    # default prices: no H200 entry -> not priced, and the note says why
    t = build_table(EXPERIMENT, logged)
    assert {r["cost"] for r in t.rows} == {"—"}
    assert any(n.startswith("cost: —") for n in t.notes)
    t = build_table(EXPERIMENT, logged, prices=_prices_file(tmp_path, 3.5))
    # client-latency-*.json holds conc16 and conc64: the highest measured level is 64
    assert "$ / 1M out tok (derived, @c64)" in t.headers()
    rows = {r["arm"]: r for r in t.rows}
    for arm in ("bf16", "fp8", "fp8kv"):
        tps = json.loads((shared_data_module / "vllm-h200" / f"client-latency-{arm}.json").read_text())["conc64"][
            "out_tok_per_s"]
        assert rows[arm]["cost"] == f"{3.5 / (tps * 3600) * 1e6:.3f}", arm
    assert rows["fp8marlin"]["cost"] == "—"  # no latency/sweep row was logged for it
    assert any("H200 $3.5/h (2026-11-30" in n for n in t.notes)


def test_compare_cli_prices(store_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    assert main(["compare", "--experiment", EXPERIMENT, "--tracking-uri", store_uri, "--format", "csv",
                 "--prices", str(_prices_file(tmp_path, 3.5))]) is None
    import csv
    import io

    rows = {r["arm"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    # the machine view: the cost a bare number, its concurrency its own column (the table's "@c64" header)
    assert rows["bf16"]["cost_concurrency"] == "64" and float(rows["bf16"]["usd_per_1m_out_tok"]) > 0
    assert rows["fp8marlin"]["usd_per_1m_out_tok"] == "" and "kv_mib" in rows["bf16"]
    bad = tmp_path / "bad.toml"
    bad.write_text("[[price]]\ngpu = 'H200'\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--experiment", EXPERIMENT, "--tracking-uri", store_uri, "--prices", str(bad)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (f"quantrack: error: prices file {str(bad)!r}: [[price]] #1: missing "
                                               "'usd_per_hour' (every price needs gpu, usd_per_hour, date, source)")


def test_kv_mib_shows_the_kv_dtype_on_llamacpp(shared_data_module: Path, tmp_path: Path,
                                               logged: list[RunRow]) -> None:
    """Same -c, same token capacity: the KV type shows only in MiB (real xllamacpp logs: f16 vs q8_0 KV)."""
    import dataclasses

    study = load_study(Path(__file__).resolve().parents[2] / "examples" / "cpu-smollm2.toml")
    study = dataclasses.replace(study, tracking=dataclasses.replace(study.tracking, experiment="kv-mib"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    d = shared_data_module / "llamacpp-cpu"
    for arm, log in (("Q8_0", "xllamacpp-Q8_0-kvf16.log"), ("Q8_0-kvq8_0", "xllamacpp-Q8_0-kvq8_0.log")):
        log_results(LogInputs(study=study, arm=arm, server_log=d / log, tracking_uri=uri))
    rows = {r["arm"]: r for r in compare_experiment("kv-mib", "Q8_0", uri).rows}
    # "llama_kv_cache: size =   45.00 MiB (  2048 cells, ...) K (f16)" / "size =   23.91 MiB ... K (q8_0)"
    assert rows["Q8_0"]["kv_mib"] == "45.00" and rows["Q8_0-kvq8_0"]["kv_mib"] == "23.91"
    assert rows["Q8_0"]["capacity_tok"] == rows["Q8_0-kvq8_0"]["capacity_tok"] == "2,048"
    # no sweep was logged for these runs: no cost; the vLLM runs never logged a KV MiB: FILL IN, not a guess
    assert rows["Q8_0"]["cost"] == "—"
    assert {r["kv_mib"] for r in build_table(EXPERIMENT, logged).rows} == {FILL}


def _rerun(r: RunRow, run_id: str, status: str, start: int) -> RunRow:
    return RunRow(**{**r.__dict__, "run_id": run_id, "status": status, "start_time": start})


def test_latest_finished_run_shown_others_counted(logged: list[RunRow]) -> None:
    bf16 = next(r for r in logged if r.arm == "bf16")
    newest = max(r.start_time for r in logged)
    runs = [*logged, _rerun(bf16, "f" * 32, "FAILED", newest + 10), _rerun(bf16, "k" * 32, "KILLED", newest + 20)]
    t = build_table(EXPERIMENT, runs)
    assert t.raw[0]["run_id"] == bf16.run_id and t.rows[0]["status"] == "finished"
    assert t.skipped == {"bf16": {"FAILED": 1, "KILLED": 1}}
    assert ("several runs per arm: bf16: latest FINISHED run shown, 2 other runs skipped (FAILED 1, KILLED 1)."
            in t.notes)
    assert "2 other runs skipped" in render(t, "table") and json.loads(render(t, "json"))["values"][0][
        "skipped_runs"] == {"FAILED": 1, "KILLED": 1}
    # one run per arm: no footnote
    assert not any(n.startswith("several runs") for n in build_table(EXPERIMENT, logged).notes)


H200_STORE = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "h200-mlflow-store-session1.tar.gz"


@pytest.fixture(scope="module")
def h200_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The real H200 store (vLLM + SGLang studies, FP8 probes) extracted into a temp dir (read-only use)."""
    import tarfile

    if not H200_STORE.is_file():
        pytest.skip(f"{H200_STORE} not present")
    dest = tmp_path_factory.mktemp("h200-store")
    with tarfile.open(H200_STORE) as tar:
        tar.extractall(dest, filter="data")
    return f"sqlite:///{dest}/qt-mlruns/mlflow.db"


def test_real_h200_store_rerun_after_failure(h200_uri: str) -> None:
    """SGLang bf16 failed once (HTTP 500 on /tokenize) and was re-run: the re-run is shown, the failure counted."""
    t = compare_experiment("h200-sglang", None, h200_uri)
    rows = {r["arm"]: r for r in t.rows}
    assert rows["bf16"]["status"] == "finished" and rows["bf16"]["tpot_ms"] != FILL
    assert t.skipped == {"bf16": {"FAILED": 1}}
    assert "bf16: latest FINISHED run shown, 1 other run skipped (FAILED 1)" in t.notes[-1]
    assert "$ / 1M out tok (derived, @c64)" in t.headers()  # the sweep measured 1, 16, 64


H200_STORE_2 = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "h200-mlflow-store.tar.gz"


def test_real_h200_session2_store_has_kl_per_arm(tmp_path: Path) -> None:
    """Session 2 (util 0.45, KL beside each arm): self-checks exact, every FP8 arm measured, Marlin not on SGLang."""
    import tarfile

    if not H200_STORE_2.is_file():
        pytest.skip(f"{H200_STORE_2} not present")
    with tarfile.open(H200_STORE_2) as tar:
        tar.extractall(tmp_path, filter="data")
    uri = f"sqlite:///{tmp_path}/qt-mlruns/mlflow.db"
    for exp, scored in (("h200-vllm", {"bf16", "fp8", "fp8-kv", "fp8-marlin"}), ("h200-sglang", {"bf16", "fp8",
                                                                                                   "fp8-kv"})):
        t = compare_experiment(exp, None, uri)
        rows = {r["arm"]: r for r in t.rows}
        assert set(rows) == {"bf16", "fp8", "fp8-kv", "fp8-marlin"}
        assert all(r["status"] == "finished" and r["tpot_ms"] != FILL for r in rows.values())
        assert {a for a, r in rows.items() if r["kl"] != FILL} == scored
        m = {r["arm"]: r["metrics"] for r in t.raw}
        assert m["bf16"]["kl_top1_agree"] == 1.0 and m["bf16"]["kl_mean"] < 1e-9  # the self-check
        for arm in ("fp8", "fp8-kv"):
            assert 0.0 < m[arm]["kl_top1_agree"] < 0.5 and 1e-4 < m[arm]["kl_mean"] < 1e-2


def test_real_h200_session2_default_table_fits_and_says_what_it_lacks(tmp_path: Path) -> None:
    """The default table on a real store: ≤ 120 columns, the self-check marked, unrecorded contention said."""
    import tarfile

    if not H200_STORE_2.is_file():
        pytest.skip(f"{H200_STORE_2} not present")
    with tarfile.open(H200_STORE_2) as tar:
        tar.extractall(tmp_path, filter="data")
    uri = f"sqlite:///{tmp_path}/qt-mlruns/mlflow.db"
    text = render(compare_experiment("h200-vllm", None, uri))
    assert max(len(line) for line in text.splitlines()) <= 120
    bf16 = next(line for line in text.splitlines() if line.startswith("bf16 "))
    assert "100.0% / 0.0000 (self)" in bf16
    assert "yes (fp8_marlin)" in text
    assert "host contention during latency not recorded for: bf16, fp8, fp8-kv, fp8-marlin." in text


def test_a_negative_weights_metric_is_not_shown_as_a_size(logged: list[RunRow]) -> None:
    """Stores logged before the SGLang parser refused a negative 'mem usage' (quantrack's own H200 store holds
    weights_gib = -20.23 for an arm) show FILL IN, never a negative size."""
    fp8 = next(r for r in logged if r.arm == "fp8")
    runs = [r if r is not fp8 else RunRow(**{**r.__dict__, "metrics": {**r.metrics, "weights_gib": -20.23}})
            for r in logged]
    rows = {r["arm"]: r for r in build_table(EXPERIMENT, runs).rows}
    assert "-20.23" not in str(rows["fp8"]["weights_gib"]) and rows["fp8"]["weights_gib"] == "FILL IN", rows["fp8"]


def test_delta_of_an_arm_that_answered_fewer_questions_is_the_paired_one(logged: list[RunRow]) -> None:
    """An arm stopped by its budget test (or interrupted) answered a subset of the baseline's questions: Δ is the
    paired difference on the questions both answered, not the difference of two accuracies over different sets."""
    def with_outcomes(r: RunRow, outcomes: str) -> RunRow:
        answered = outcomes.replace(".", "")
        acc = answered.count("1") / len(answered)
        return RunRow(**{**r.__dict__, "tags": {**r.tags, "quantrack.gsm8k_correct": outcomes},
                         "metrics": {**r.metrics, "gsm8k_accuracy": acc, "gsm8k_n": float(len(answered))}})

    runs = [with_outcomes(r, "11110000") if r.arm == "bf16" else with_outcomes(r, "1111....") if r.arm == "fp8"
            else r for r in logged if r.arm in ("bf16", "fp8")]
    t = build_table(EXPERIMENT, runs)
    rows = {r["arm"]: r for r in t.rows}
    # unpaired it would read +50.0 (100% of 4 against 50% of 8); on the 4 both answered both are right
    assert rows["fp8"]["delta"].startswith("+0.0 pts (paired n=4)"), rows["fp8"]["delta"]
    raw = {r["arm"]: r for r in t.raw}
    assert raw["fp8"]["delta_vs_baseline"] == 0.0
