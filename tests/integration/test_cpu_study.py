"""The CPU study end to end: ``quantrack run examples/cpu-smollm2.toml`` as a user runs it (a real child
process, llama.cpp servers from xllamacpp on 127.0.0.1, SmolLM2-135M GGUF arms from conftest's cache), into
this test's own MLflow store; the assertions are on what it measured and logged.

One study run (module fixture, ~2.5 min on an idle 2-core machine, < 10 min under load) feeds every test.
Its settings are the example's own (4 slots x 1024 tokens, latency 128/32 x 5, sweep 1/2/4, GSM8K 10
questions, KL 400 positions top-20), so this is the embedded default that CI proves works.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quantrack.report.compare import FILL, build_table, compare_experiment, render
from quantrack.store.records import RunRow
from quantrack.store.tracking import load_runs, read_artifact_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cpu-smollm2.toml"
EXPERIMENT = "cpu-smollm2"
ARMS = ("F16", "Q8_0", "Q8_0-kvq8_0", "Q4_0")
CANDIDATES = ("Q8_0", "Q8_0-kvq8_0", "Q4_0")


@dataclasses.dataclass
class StudyRun:
    rc: int
    out: str
    err: str
    uri: str
    workdir: Path
    runs: dict[str, RunRow]
    parent: RunRow
    repo_workdirs: tuple[set[str], set[str]]  # the repo's default work dirs of this study, before and after


# Far above the quiet time (~2.5 min idle, ~10 min under load 4): a loaded 2-core machine must pass, and a
# real hang still ends. A failure is reported once, with its cause; the other tests say "see above".
STUDY_TIMEOUT_S = 2700
HEARTBEAT_S = 60


def _relay(proc: subprocess.Popen[str], sink: list[str], say: Any) -> None:
    """Keep the child's stderr, and show its latest line every HEARTBEAT_S so the suite is never silent."""
    import time

    last = time.monotonic()
    assert proc.stderr is not None
    for line in proc.stderr:
        sink.append(line)
        now = time.monotonic()
        if now - last >= HEARTBEAT_S:
            last = now
            say(f"[cpu study, still running] {line.rstrip()[:150]}")


@pytest.fixture(scope="module")
def _study_run(gguf_arms: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
               request: pytest.FixtureRequest) -> StudyRun | str:
    import threading

    pytest.importorskip("xllamacpp")
    tmp = tmp_path_factory.mktemp("cpu-study")
    uri = f"sqlite:///{tmp}/store/mlflow.db"
    workdir = tmp / "work"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "QUANTRACK_SPOOL_DIR": str(tmp / "spool"),
           # conftest's cache: the smollm2:* references resolve to the files gguf_arms prepared
           "QUANTRACK_CACHE": str(gguf_arms["F16"].parent)}
    default_work = REPO / ".quantrack-cache" / "runs" / EXPERIMENT
    before = {p.name for p in default_work.glob("*")}
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda m: reporter.write_line(m)) if reporter is not None else (lambda m: None)
    err: list[str] = []
    stdout = tmp / "stdout.txt"
    with stdout.open("w", encoding="utf-8") as out_fh:
        proc = subprocess.Popen([sys.executable, "-m", "quantrack.cli", "run", str(EXAMPLE), "--workdir",
                                 str(workdir)], cwd=tmp, env=env, stdout=out_fh, stderr=subprocess.PIPE, text=True)
        relay = threading.Thread(target=_relay, args=(proc, err, say), daemon=True)
        relay.start()
        timed_out = False
        try:
            proc.wait(timeout=STUDY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
    out = stdout.read_text(encoding="utf-8")
    if timed_out:
        relay.join(timeout=10)
        return (f"quantrack run did not finish within {STUDY_TIMEOUT_S} s; its last stderr lines:\n"
                + "".join(err[-20:]))
    relay.join(timeout=10)
    if proc.returncode != 0:
        return f"quantrack run exited {proc.returncode}; its last stderr lines:\n" + "".join(err[-40:])
    runs = {r.arm: r for r in load_runs(EXPERIMENT, uri)}
    parents = load_runs(EXPERIMENT, uri, role="study")
    assert len(parents) == 1
    after = {p.name for p in default_work.glob("*")}
    return StudyRun(proc.returncode, out, "".join(err), uri, workdir, runs, parents[0], (before, after))


_REPORTED: list[str] = []


@pytest.fixture
def study_run(_study_run: StudyRun | str) -> StudyRun:
    if isinstance(_study_run, str):
        if not _REPORTED:
            _REPORTED.append(_study_run)
            pytest.fail(_study_run, pytrace=False)
        pytest.fail("the CPU study run failed: see the first failure of this module for its cause", pytrace=False)
    return _study_run


def test_four_arms_finished_under_one_parent(study_run: StudyRun) -> None:
    lines = [ln.split("\t") for ln in study_run.out.strip().splitlines()[-len(ARMS):]]
    assert [(ln[0], ln[1]) for ln in lines] == [(a, "FINISHED") for a in ARMS]
    assert sorted(study_run.runs) == sorted(ARMS)
    for arm in ARMS:
        r = study_run.runs[arm]
        assert r.status == "FINISHED", (arm, r.tags.get("quantrack.error"))
        assert r.tags["mlflow.parentRunId"] == study_run.parent.run_id
        assert r.params["model_ref"] == f"smollm2:{arm.split('-')[0]}"
        assert r.tags["quantrack.verdict"] == "allow" and r.tags["quantrack.fallback"] == "no"
    assert study_run.parent.status == "FINISHED"
    # said plainly, before the arms run: the baseline is a dequantized 4-bit checkpoint
    err = study_run.err
    note = err.index("smollm2:F16 is that checkpoint dequantized")
    assert note < err.index("[F16] preflight")
    assert "deltas against it measure requantization only" in err


def test_nothing_written_into_the_repository(study_run: StudyRun) -> None:
    ids = [r.run_id for r in study_run.runs.values()] + [study_run.parent.run_id]
    for rid in ids:
        assert not (REPO / "mlruns" / "artifacts" / rid).exists()
    before, after = study_run.repo_workdirs
    assert after == before  # server logs and eval records went to --workdir
    logs = {p.name for p in study_run.workdir.glob("*-server.log")}
    assert logs == {f"{a}-server.log" for a in ARMS} | {f"{a}-kl-baseline-server.log" for a in CANDIDATES}


def test_kv_cache_predicted_equals_reported(study_run: StudyRun) -> None:
    m = {a: study_run.runs[a].metrics for a in ARMS}
    for arm in ARMS:
        # llama.cpp allocates every cell up front: the prediction is arithmetic and must match the log
        assert m[arm]["kv_tokens_reported"] == m[arm]["kv_tokens_predicted"] == 4096
        assert m[arm]["capacity_error_pct"] == 0.0
        assert abs(m[arm]["kv_mib_error_pct"]) < 0.05
        assert m[arm]["kv_cells_per_stream"] == 1024 and m[arm]["kv_streams"] == 4  # -c 4096 -np 4
    f16_kv = {m[a]["kv_mib_reported"] for a in ("F16", "Q8_0", "Q4_0")}
    assert len(f16_kv) == 1  # the weights' type does not change the cache
    # q8_0 stores 32 values in 34 bytes, f16 in 64: the q8_0-KV arm holds the same cells in 0.53 of the MiB
    assert m["Q8_0-kvq8_0"]["kv_mib_reported"] / f16_kv.pop() == pytest.approx(34 / 64, abs=0.002)
    assert "[Q8_0-kvq8_0] capacity: KV tokens predicted 4,096 (derived) vs reported 4,096 (log)" in study_run.err


def test_weights_shrink_with_the_file_type(study_run: StudyRun) -> None:
    w = {a: study_run.runs[a].metrics["weights_gib"] for a in ARMS}  # from "print_info: file size" in each log
    assert w["Q4_0"] < w["Q8_0"] < w["F16"]
    assert w["Q8_0"] == w["Q8_0-kvq8_0"]
    import json

    for arm in ARMS:
        rep = json.loads(read_artifact_text(study_run.runs[arm].run_id, "server/log_report.json", study_run.uri) or "{}")
        assert rep["extra"]["file_type"].split(" ")[0] == arm.split("-")[0]
        assert rep["extra"]["k_type"] == rep["extra"]["v_type"] == ("q8_0" if arm == "Q8_0-kvq8_0" else "f16")


def test_tpot_measured_and_within_2pct_of_the_server(study_run: StudyRun) -> None:
    for arm in ARMS:
        m = study_run.runs[arm].metrics
        assert m["latency_n_ok"] == 5 and m["latency_n_failed"] == 0
        client, server = m["tpot_ms_p50"], m["server_tpot_ms"]  # median vs median
        assert client > 0 and server > 0
        # 2% on a quiet host (the run's own hygiene says so); when other processes took the cores the client is
        # descheduled between chunks and its TPOT includes that wait: the bound is looser, never skipped
        quiet = study_run.runs[arm].tags.get("quantrack.latency_contention") == "no"
        assert abs(client - server) / server < (0.02 if quiet else 0.25), (arm, client, server, quiet)
        for c in (1, 2, 4):
            assert m[f"sweep_output_tps_c{c}"] > 0


def test_speedup_plots_written_and_logged(study_run: StudyRun) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=study_run.uri)
    for arm in CANDIDATES:
        png = study_run.workdir / f"speedup-{arm}-vs-F16.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"speedup plot: {png}" in study_run.err
        logged = sorted(a.path for a in client.list_artifacts(study_run.runs[arm].run_id, "plots"))
        # the speedup plot, beside the engine's own scraped view of the sweep when its /metrics answered
        assert f"plots/{png.name}" in logged and set(logged) <= {f"plots/{png.name}", f"plots/engine-{arm}.png"}
    base_plots = [a.path for a in client.list_artifacts(study_run.runs["F16"].run_id, "plots")]
    assert not [p for p in base_plots if "speedup" in p]  # no plot of the baseline vs itself


def test_gsm8k_measured_with_its_interval(study_run: StudyRun) -> None:
    for arm in ARMS:
        m = study_run.runs[arm].metrics
        assert m["gsm8k_n"] == 10 and m["gsm8k_errors"] == 0
        assert m["gsm8k_ci_low"] <= m["gsm8k_accuracy"] <= m["gsm8k_ci_high"]
        assert m["gsm8k_ci_high"] - m["gsm8k_ci_low"] > 0.2  # 10 questions: the interval is wide, and shown
        assert len(study_run.runs[arm].tags["quantrack.gsm8k_correct"]) == 10
    assert "[F16] eval: GSM8K" in study_run.err and "95% interval" in study_run.err


def test_kl_for_every_candidate_against_the_baseline(study_run: StudyRun) -> None:
    base = study_run.runs["F16"].metrics
    assert "kl_top1_agree" not in base and "kl_mean" not in base  # not measured for the baseline itself
    agree = {}
    for arm in CANDIDATES:
        m, p = study_run.runs[arm].metrics, study_run.runs[arm].params
        assert m["kl_positions"] == 400 and p["kl_top_k"] == "20" and p["kl_baseline"] == "F16"
        assert 0.0 < m["kl_top1_agree"] < 1.0 and m["kl_mean"] > 0.0
        agree[arm] = m["kl_top1_agree"]
    assert agree["Q4_0"] < agree["Q8_0"]
    assert study_run.runs["Q4_0"].metrics["kl_mean"] > study_run.runs["Q8_0"].metrics["kl_mean"]
    # the KL baseline server ran after the candidate's latency and sweep, with its own log
    for arm in CANDIDATES:
        assert (study_run.workdir / f"{arm}-kl-baseline-server.log").is_file()
        err = study_run.err
        assert err.index(f"[{arm}] sweep: output throughput") < err.index(f"[{arm}] kl: baseline 'F16' served")


MEASURED_CELLS = ("weights_gib", "capacity_tok", "predicted_tok", "capacity_error", "tpot_ms", "gsm8k", "fallback")


def test_compare_fills_what_was_measured_and_nothing_else(study_run: StudyRun) -> None:
    table = compare_experiment(EXPERIMENT, None, study_run.uri)
    assert table.baseline == "F16"
    rows = {r["arm"]: r for r in table.rows}
    assert sorted(rows) == sorted(ARMS)
    for arm, row in rows.items():
        for key in MEASURED_CELLS:
            assert row[key] != FILL, (arm, key)
        assert row["status"] == "finished"
    for arm in CANDIDATES:
        assert rows[arm]["top1_agree"] != FILL and rows[arm]["kl"] != FILL
        assert rows[arm]["delta"].endswith(" pts") and rows[arm]["paired_test"].startswith("McNemar p=")
    # the baseline's own KL was never measured: it reads '— (baseline)', neither 100% / 0 nor FILL IN
    assert rows["F16"]["top1_agree"] == rows["F16"]["kl"] == "— (baseline)"  # the baseline, not "not measured"
    # the run printed this very table (same runs, same widths) at its end
    lines = render(table, "table").splitlines()
    for line in lines[1:7]:  # header, rule, four arm rows
        assert line in study_run.out.splitlines()


def test_an_arm_without_eval_reads_fill_in(study_run: StudyRun) -> None:
    """The same compare on runs that lack a measurement: a run of the Q4_0 arm with its real server log
    only (no latency, no eval, no KL), logged into another experiment."""
    from quantrack.runner import LogInputs, log_results
    from quantrack.study import load_study

    study = load_study(EXAMPLE)
    study = dataclasses.replace(study, tracking=dataclasses.replace(study.tracking, experiment="cpu-no-eval"))
    _rec, logged = log_results(LogInputs(study=study, arm="Q4_0", server_log=study_run.workdir / "Q4_0-server.log",
                                        tracking_uri=study_run.uri))
    assert logged.run_id
    row = compare_experiment("cpu-no-eval", None, study_run.uri).rows[0]
    assert row["arm"] == "Q4_0"
    assert row["weights_gib"] == rows_of(study_run)["Q4_0"]["weights_gib"] != FILL  # measured from its log
    for key in ("tpot_ms", "gsm8k", "top1_agree", "kl"):
        assert row[key] == FILL, key
    # and the same for the study's own runs with the eval metrics removed: nothing is filled in from elsewhere
    runs = [dataclasses.replace(r, metrics={k: v for k, v in r.metrics.items() if not k.startswith("gsm8k_")})
            if r.arm == "Q8_0" else r for r in study_run.runs.values()]
    stripped = {r["arm"]: r for r in build_table(EXPERIMENT, runs, "F16").rows}
    assert stripped["Q8_0"]["gsm8k"] == FILL and stripped["Q8_0"]["delta"] == FILL
    assert stripped["Q4_0"]["gsm8k"] != FILL


def rows_of(study_run: StudyRun) -> dict[str, dict[str, Any]]:
    return {r["arm"]: r for r in compare_experiment(EXPERIMENT, None, study_run.uri).rows}


def test_bad_model_reference_is_one_line_exit_2(tmp_path: Path, _isolated_tracking: Path) -> None:
    study = tmp_path / "bad.toml"
    study.write_text(EXAMPLE.read_text(encoding="utf-8").replace('"smollm2:Q4_0"', '"smollm2:Q5_K"'),
                     encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "quantrack.cli", "run", str(study)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    # refused when the study is read (the shipped model table), naming the file, the arm and the types it has
    assert proc.stderr.strip() == (f"quantrack: error: study file '{study}': [[arms]] 'Q4_0' model: model reference "
                                   "'smollm2:Q5_K': no type Q5_K; smollm2 has: Q4_1, F16, Q8_0, Q4_0, HF-BF16")
    assert not (_isolated_tracking / "mlflow.db").exists()  # rejected before anything was started or logged
