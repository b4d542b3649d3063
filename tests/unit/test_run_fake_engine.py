"""run_study / run_arm end to end on the fake engine (tests/fake_engine.py): a real server process (the SSE
fixture) started and stopped by ManagedServer, a real llama.cpp startup log parsed, real GSM8K questions asked, every
arm logged to a real (temporary, per test) MLflow store, in seconds and without an inference engine.

Registering the engine is one call in one module (tests/fake_engine.py): that is the proof docs/engines.md points at.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quantrack import engines
from quantrack.errors import NotFound
from quantrack.interrupts import Interrupted
from quantrack.run.orchestrate import run_study
from quantrack.run.outcome import RunOptions
from quantrack.run.schema import STATUS_FAILED, STATUS_FINISHED, STATUS_KILLED, Tag
from quantrack.study import study_from_dict
from tests.fake_engine import KIND, FakeAdapter, registered


def _study(name: str, **over: Any) -> Any:
    data: dict[str, Any] = {
        "name": name,
        "context_len": 1024,
        "model": {"path": "fake-model.gguf"},
        "engine": {"kind": KIND, "ready_timeout_s": 30.0},
        "gpu": {"name": "x86-cpu"},
        "latency": {"input_tokens": 8, "output_tokens": 6, "warmup": 1, "iterations": 3},
        "sweep": {"concurrency": [1, 2], "requests_per_level": 4, "input_tokens": 8, "output_tokens": 6},
        "eval": {"task": "gsm8k", "num_questions": 3, "num_shots": 1, "max_tokens": 8, "concurrency": 2},
        "arms": [{"name": "base", "weights": "f16", "baseline": True},
                 {"name": "q8", "weights": "q8_0", "kv": "q8_0"}],
    }
    for k, v in over.items():
        data[k] = v if not isinstance(v, dict) else {**data.get(k, {}), **v}
    return study_from_dict(data, source=f"{name}.toml")


@pytest.fixture(scope="module")
def _migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store created once (its schema migrations take ~15 s on a busy two-core machine)."""
    import mlflow

    db = tmp_path_factory.mktemp("template-store") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(_migrated_store: Path, _isolated_tracking: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's own store (conftest's isolation), started from a copy of the migrated empty one."""
    db = _isolated_tracking / "fake-engine.db"
    shutil.copyfile(_migrated_store, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    # the study names a local GGUF, which `run` refuses when it does not exist: the fake engine never opens it
    monkeypatch.chdir(_isolated_tracking)
    (_isolated_tracking / "fake-model.gguf").write_bytes(b"GGUF")


@pytest.fixture
def fake() -> Iterator[FakeAdapter]:
    with registered() as adapter:
        yield adapter


def _runs(experiment: str) -> dict[str, Any]:
    from quantrack.store.tracking import load_runs

    return {r.tags.get("quantrack.arm") or r.params.get("arm"): r for r in load_runs(experiment)}


def test_registering_is_one_call_and_undone(fake: FakeAdapter) -> None:
    from quantrack.engines.detect import detect_text

    assert KIND in engines.ENGINE_KINDS and engines.get_adapter(KIND) is fake
    assert detect_text("PORT 41234\n").engine == KIND  # its marker joined detection
    engines.unregister(KIND)
    try:
        assert KIND not in engines.ENGINE_KINDS and detect_text("PORT 41234\n").engine is None
        with pytest.raises(NotFound, match="unknown engine 'fake'"):
            engines.get_adapter(KIND)
    finally:
        engines.register(fake)


def test_a_finished_study_logs_latency_sweep_and_eval(fake: FakeAdapter, store: None, tmp_path: Path) -> None:
    lines: list[str] = []
    res = run_study(_study("fake-ok"), RunOptions(workdir=tmp_path), progress=lines.append)
    assert [o.status for o in res.outcomes] == [STATUS_FINISHED, STATUS_FINISHED], lines
    for out in res.outcomes:
        assert out.steps[:3] == ["preflight", "serve", "parse_log"]
        assert {"latency", "sweep", "eval"} <= set(out.steps)
        assert len(out.latency.samples) == 3 and out.latency.n_failed == 0
        assert [r["concurrency"] for r in out.sweep.rows] == [1, 2]
        assert out.eval.num_questions == 3 and out.eval.errors == 0
        # the canned xllamacpp log, parsed with llama.cpp's rules under the fake engine's name
        assert out.log_report.engine == KIND and out.log_report.kv_cache_tokens == 1024
        assert out.live is not None and out.live.model == "fixture-model"
    runs = _runs(res.experiment)
    assert set(runs) == {"base", "q8"} and {r.status for r in runs.values()} == {STATUS_FINISHED}
    # issue #43: the step checkpoints written while the arms ran are gone once each arm is logged
    from quantrack.store.tracking import CHECKPOINTS, spool_dir

    assert not (spool_dir() / CHECKPOINTS).exists() or not list((spool_dir() / CHECKPOINTS).iterdir())
    # issue #39: the weights loaded, by SHA-256 (the study's local file), and the model they came from
    import hashlib

    want = hashlib.sha256(b"GGUF").hexdigest()
    for r in runs.values():
        assert r.tags[Tag.MODEL_SHA256] == want and Tag.MODEL_SOURCE_SHA256 not in r.tags  # a plain file


def test_a_failing_step_logs_failed_with_what_it_had(fake: FakeAdapter, store: None, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The eval step raising (here: GSM8K data that cannot be read) fails the arm; its latency and sweep stay."""
    from quantrack.accuracy import gsm8k

    def broken(*_a: Any, **_k: Any) -> Any:
        raise OSError("gsm8k test split unreadable")

    monkeypatch.setattr(gsm8k, "run_gsm8k", broken)
    res = run_study(_study("fake-fail", arms=[{"name": "base", "weights": "f16", "baseline": True}]),
                    RunOptions(workdir=tmp_path))
    (out,) = res.outcomes
    assert out.status == STATUS_FAILED and out.failed_step == "eval"
    assert out.error == "eval: OSError: gsm8k test split unreadable"
    assert out.latency is not None and out.sweep is not None and out.eval is None
    run = _runs(res.experiment)["base"]
    assert run.status == STATUS_FAILED and run.tags[Tag.FAILED_STEP] == "eval"
    assert any(k.startswith("tpot") for k in run.metrics) and any("sweep" in k for k in run.metrics)


def test_an_interrupt_logs_killed_with_partial_results(store: None, tmp_path: Path) -> None:
    """SIGINT during the sweep (tokens every 40 ms): the arm is KILLED in step sweep, its latency is logged, the
    server is stopped, the parent run is KILLED and Interrupted goes up."""
    with registered(FakeAdapter(interval_ms=40)):
        lines: list[str] = []

        def progress(line: str) -> None:
            lines.append(line)
            if line.startswith("[base] sweep: concurrency"):
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()

        with pytest.raises(Interrupted):
            run_study(_study("fake-int"), RunOptions(workdir=tmp_path), progress=progress)
    runs = _runs("fake-int")
    assert set(runs) == {"base"}, lines  # the study stopped: q8 never started
    run = runs["base"]
    assert run.status == STATUS_KILLED and run.tags[Tag.FAILED_STEP] == "sweep", run.tags
    assert run.tags[Tag.ERROR] == "interrupted (SIGINT) in step sweep"
    assert any(k.startswith("tpot") for k in run.metrics)  # the latency measured before the interrupt
    pid = int(next(x for x in lines if x.startswith("[base] server ready")).rsplit("pid ", 1)[1].rstrip(")"))
    with pytest.raises(ProcessLookupError):  # the engine was stopped (and reaped) before the arm was logged
        os.kill(pid, 0)
    assert KIND not in engines.ENGINE_KINDS


def test_a_study_asks_a_task_file_and_logs_it_under_its_own_name(fake: FakeAdapter, store: None,
                                                                   tmp_path: Path) -> None:
    """Issue #38: `[eval] task = "PATH.jsonl"` in a study: every arm asks the task file's items, its metrics are
    named after the task (not gsm8k_*), the outcome string follows the file's item order, and `compare` pairs the
    arms on it. The fake server answers " w0 w1" at max_tokens 2: two of the three references are that text."""
    import json

    from quantrack.report.compare import build_table
    from quantrack.store.tracking import load_runs

    task = tmp_path / "support-bot.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "a", "prompt": "say w0 w1", "reference": "w0 w1"},
        {"id": "b", "prompt": "say no", "reference": "no"},
        {"id": "c", "prompt": "again", "reference": "W0 W1"})))
    study = study_from_dict({
        "name": "fake-task", "context_len": 1024, "model": {"path": "fake-model.gguf"},
        "engine": {"kind": KIND, "ready_timeout_s": 30.0}, "gpu": {"name": "x86-cpu"},
        "eval": {"task": str(task), "scorer": "exact", "max_tokens": 2, "concurrency": 2},
        "arms": [{"name": "base", "weights": "f16", "baseline": True}, {"name": "q8", "weights": "q8_0"}],
    }, source="fake-task.toml")  # the store fixture's folder holds fake-model.gguf
    assert study.eval.num_questions == 3 and study.eval.num_shots == 0  # every item, no exemplars
    lines: list[str] = []
    res = run_study(study, RunOptions(workdir=tmp_path / "work"), progress=lines.append)
    assert [o.status for o in res.outcomes] == [STATUS_FINISHED, STATUS_FINISHED], lines
    assert (tmp_path / "work" / "q8-support_bot.jsonl").is_file()
    runs = {r.arm: r for r in load_runs("fake-task")}
    for r in runs.values():
        assert r.metrics["support_bot_accuracy"] == pytest.approx(2 / 3) and r.metrics["support_bot_n"] == 3
        assert "gsm8k_accuracy" not in r.metrics
        assert r.tags["quantrack.eval_metrics"] == "support_bot"
        assert r.tags["quantrack.support_bot_correct"] == "101"  # a, b, c in file order
    rows = {row["arm"]: row for row in build_table("fake-task", list(runs.values())).rows}
    assert rows["q8"]["gsm8k"].startswith("66.7% [") and rows["q8"]["delta"] == "+0.0 pts"
    assert rows["q8"]["paired_test"].startswith("McNemar p=1 (n=3)")
    table = build_table("fake-task", list(runs.values()))
    assert "support_bot" in table.headers()


def test_a_task_file_study_with_a_budget_stops_the_arm_when_settled(fake: FakeAdapter, store: None,
                                                                    tmp_path: Path) -> None:
    """Issue #38: `[eval] budget` on a task file: the baseline asks every item in the seeded order, the other arm
    stops when its sequential verdict settles (the fake server answers alike for both arms: no discordance), and the
    verdict is logged as for GSM8K; the outcome string keeps the file's item order with '.' for items not asked."""
    import json

    from quantrack.store.tracking import load_runs

    task = tmp_path / "bot.jsonl"
    task.write_text("".join(json.dumps({"id": f"q{i:02d}", "prompt": f"item {i}",
                                        "reference": "w0 w1" if i % 2 else "no"}) + "\n" for i in range(40)))
    study = study_from_dict({
        "name": "fake-task-budget", "context_len": 1024, "model": {"path": "fake-model.gguf"},
        "engine": {"kind": KIND, "ready_timeout_s": 30.0}, "gpu": {"name": "x86-cpu"},
        "eval": {"task": str(task), "scorer": "exact", "max_tokens": 2, "concurrency": 1, "order": "shuffled",
                 "budget": "50pp"},
        "arms": [{"name": "base", "weights": "f16", "baseline": True}, {"name": "q8", "weights": "q8_0"}],
    }, source="fake-task-budget.toml")
    lines: list[str] = []
    res = run_study(study, RunOptions(workdir=tmp_path / "work"), progress=lines.append)
    assert [o.status for o in res.outcomes] == [STATUS_FINISHED, STATUS_FINISHED], lines
    runs = {r.arm: r for r in load_runs("fake-task-budget")}
    base, q8 = runs["base"], runs["q8"]
    assert base.metrics["bot_n"] == 40 and "quantrack.budget_verdict" not in base.tags
    used = int(q8.metrics["budget_questions_used"])
    assert q8.tags["quantrack.budget_verdict"] == "within" and q8.tags["quantrack.budget_method"] == "sequential"
    assert 1 <= used < 40 and q8.metrics["bot_n"] == used, lines
    assert any("[q8] budget vs base: within a 50 pts budget" in x for x in lines), lines
    outcomes = q8.tags["quantrack.bot_correct"]
    assert len(outcomes) == 40 and outcomes.count(".") == 40 - used
    assert base.tags["quantrack.bot_correct"] == "".join("1" if i % 2 else "0" for i in range(40))
    ids = [json.loads(x)["id"] for x in (tmp_path / "work" / "base-bot.jsonl").read_text().splitlines()]
    assert sorted(ids) == [f"q{i:02d}" for i in range(40)] and ids != sorted(ids)  # the seeded permutation
    asked = [json.loads(x)["id"] for x in (tmp_path / "work" / "q8-bot.jsonl").read_text().splitlines()]
    assert asked == ids[:used]  # the same permutation, stopped when settled


@pytest.mark.parametrize(("extra", "message"), [
    ({"num_shots": 5}, "[eval] num_shots does not apply to task"),
    ({"budget": "1pp"}, "[eval] budget needs order = \"shuffled\""),
    ({"budget": "lots", "order": "shuffled"}, "[eval] budget"),
    ({"order": "backwards"}, "backwards"),
    ({"scorer": "nope"}, "nope"),
    ({"num_questions": 9}, "[eval] num_questions 9:"),
    ({"chat": "yes"}, "[eval] chat: expected true or false"),
    ({"scorer": ""}, "[eval] scorer: expected a non-empty string"),
])
def test_a_task_file_study_refuses_what_does_not_apply(tmp_path: Path, extra: dict[str, Any], message: str) -> None:
    import json

    from quantrack.errors import BadInput

    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps({"id": "a", "prompt": "p", "reference": "r"}) + "\n")
    with pytest.raises(BadInput, match=re.escape(message)):
        study_from_dict({
            "name": "x", "model": {"path": "m.gguf"}, "engine": {"kind": "llamacpp"},
            "eval": {"task": "t.jsonl", "scorer": "exact", **extra},
            "arms": [{"name": "base", "weights": "f16", "baseline": True}],
        }, source=str(tmp_path / "s.toml"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_right_after_a_sweep_level_keeps_that_level(store: None, tmp_path: Path, signum: int) -> None:
    """Issue #43: the signal lands as the level's "concurrency 1: 4/4" line is said (its last request back, its row
    not built yet). The KILLED record has the level: its per-level metrics (named by the concurrency) and its row in
    the sweep artifact; the level after it, cut short, is not there."""
    import json

    from quantrack.store.tracking import read_artifact_text

    with registered(FakeAdapter(interval_ms=5)):
        lines: list[str] = []

        def progress(line: str) -> None:
            lines.append(line)
            if line.startswith("[base] sweep concurrency 1: 4/4"):
                os.kill(os.getpid(), signum)

        with pytest.raises(Interrupted):
            run_study(_study("fake-level", arms=[{"name": "base", "weights": "f16", "baseline": True}]),
                      RunOptions(workdir=tmp_path), progress=progress)
    assert any(x.startswith("[base] sweep concurrency 1: 4/4") for x in lines), lines
    run = _runs("fake-level")["base"]
    assert run.status == STATUS_KILLED and run.tags[Tag.FAILED_STEP] == "sweep", run.tags
    assert run.metrics["sweep_output_tps_c1"] > 0 and "sweep_tpot_ms_p50_c1" in run.metrics
    assert not any(k.endswith("_c2") for k in run.metrics)
    data = json.loads(read_artifact_text(run.run_id, "sweep/sweep.json") or "{}")
    assert data["interrupted"] is True
    assert [(r["concurrency"], r["n_ok"]) for r in data["rows"]] == [(1, 4)]


def test_the_engine_gone_after_a_sweep_level_keeps_that_level(store: None, tmp_path: Path) -> None:
    """Issue #43: the engine killed right after level 1's last answer. The arm is FAILED in the sweep, and its record
    still has level 1 (metrics and the artifact's row), with where the sweep ended."""
    import json

    from quantrack.store.tracking import read_artifact_text

    with registered(FakeAdapter(interval_ms=5)):
        lines: list[str] = []

        def progress(line: str) -> None:
            lines.append(line)
            if line.startswith("[base] sweep concurrency 1: 4/4"):
                ready = next(x for x in lines if x.startswith("[base] server ready"))
                os.kill(int(ready.rsplit("pid ", 1)[1].rstrip(")")), signal.SIGKILL)

        res = run_study(_study("fake-gone", arms=[{"name": "base", "weights": "f16", "baseline": True}]),
                        RunOptions(workdir=tmp_path), progress=progress)
    (out,) = res.outcomes
    assert out.status == STATUS_FAILED and out.failed_step == "sweep", (out.error, lines[-5:])
    run = _runs("fake-gone")["base"]
    assert run.status == STATUS_FAILED and run.metrics["sweep_output_tps_c1"] > 0, run.tags
    data = json.loads(read_artifact_text(run.run_id, "sweep/sweep.json") or "{}")
    assert [(r["concurrency"], r["n_ok"]) for r in data["rows"]] == [(1, 4)]
    assert data["ended_early"] == "an error in level c2" and "connection refused" in out.error


def test_the_outcome_holds_each_sweep_level_while_the_next_is_measured(fake: FakeAdapter, store: None, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What a forced exit (a second signal) spools is the arm's outcome as it is at that moment: each finished level
    is in it before the next level sends anything, not only when the step returns."""
    from quantrack.arms import Arm
    from quantrack.measure import sweep as sweep_mod
    from quantrack.run.orchestrate import run_arm
    from quantrack.run.outcome import ArmOutcome
    from quantrack.run.steps import local_node

    study = _study("fake-held", arms=[{"name": "base", "weights": "f16", "baseline": True}],
                   sweep={"concurrency": [1, 2, 3]}, eval={"task": None})
    arm: Arm = study.baseline
    out = ArmOutcome(arm=arm)
    held_at_plan: list[list[int]] = []
    real = sweep_mod._plan_level

    def plan(*a: Any, **k: Any) -> Any:  # a level about to send its first request
        held_at_plan.append([r["concurrency"] for r in out.sweep.rows] if out.sweep is not None else [])
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "_plan_level", plan)
    run_arm(study, arm, RunOptions(), tmp_path, local_node(), lambda _m: None, out=out)
    assert out.status == STATUS_FINISHED, out.error
    assert held_at_plan == [[], [1], [1, 2]]


_CLI_STUDY = """
name = "fake-cli"
context_len = 1024
[model]
path = "fake-model.gguf"
[engine]
kind = "fake"
ready_timeout_s = 30.0
[gpu]
name = "x86-cpu"
[latency]
input_tokens = 8
output_tokens = 6
warmup = 1
iterations = 3
[sweep]
concurrency = [1, 2]
requests_per_level = 4
input_tokens = 8
output_tokens = 6
[eval]
task = "gsm8k"
num_questions = 3
num_shots = 1
max_tokens = 8
concurrency = 2
[decision]
max_accuracy_drop = "1pp"
[[arms]]
name = "base"
weights = "f16"
baseline = true
[[arms]]
name = "q8"
weights = "q8_0"
kv = "q8_0"
"""


def test_run_prints_the_decision_right_under_its_table(fake: FakeAdapter, store: None, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`quantrack run`'s stdout: the closing table, the decision line at once under it (the same sentence as the
    page's Recommendation and `quantrack report`'s), a blank line, then one line per arm."""
    import html
    import re

    from quantrack.cli import main

    study = tmp_path / "fake-cli.toml"
    study.write_text(_CLI_STUDY, encoding="utf-8")
    (tmp_path / "fake-model.gguf").write_bytes(b"GGUF")  # named by the study, never opened by the fake engine
    work = tmp_path / "work"
    assert main(["run", str(study), "--workdir", str(work)]) is None
    out = capsys.readouterr().out.splitlines()
    blank = len(out) - 1 - out[::-1].index("")  # the table holds a blank line of its own (before its legend)
    decision = [i for i, ln in enumerate(out) if ln.startswith("decision")]
    assert decision == [blank - 1], out  # one section, one line, the last before the blank line
    assert out[0].startswith("experiment: fake-cli") and "base" in "\n".join(out[:blank - 1])  # the table above it
    assert [ln.split("\t")[:2] for ln in out[blank + 1:]] == [["base", STATUS_FINISHED], ["q8", STATUS_FINISHED]]
    said = out[blank - 1].removeprefix("decision: ")
    page = (work / "report.html").read_text(encoding="utf-8")
    shown = re.search(r"<b>Recommendation:</b> (.*?)</div>", page, re.DOTALL)
    assert shown is not None and html.unescape(shown.group(1)) == said
    assert main(["report", "--experiment", "fake-cli", "--out", str(tmp_path / "again.html")]) is None
    assert f"x86-cpu: {said}" in capsys.readouterr().out.splitlines()


def test_task_file_keys_on_gsm8k_are_refused_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`[eval] scorer` / `chat` only apply to a task file or humaneval: on a GSM8K study the CLI says so in one line,
    exit 2, nothing created."""
    from quantrack.cli import main

    study = tmp_path / "s.toml"
    study.write_text('name = "x"\n[model]\nname = "SmolLM2-135M"\n[engine]\nkind = "llamacpp"\n'
                     '[eval]\ntask = "gsm8k"\nscorer = "exact"\n[[arms]]\nname = "b"\nweights = "f16"\n'
                     'baseline = true\n', encoding="utf-8")
    before = set(tmp_path.iterdir())
    with pytest.raises(SystemExit) as exc:
        main(["preflight", "--study", str(study)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "[eval] scorer applies to a task file or humaneval, not to task gsm8k" in err
    assert set(tmp_path.iterdir()) == before


def test_a_gpu_arm_whose_model_folder_is_missing_fails_before_the_engine(tmp_path: Path) -> None:
    """vLLM reads a missing local path as a Hub repository id and fails with a traceback (seen on the H200 when a
    calibrated checkpoint was not written): the arm's serve step fails first, naming the folder."""
    from quantrack.engines import get_adapter
    from quantrack.run.outcome import StepError
    from quantrack.run.steps import check_model_folder

    vllm = get_adapter("vllm")
    with pytest.raises(StepError, match=re.escape(f"model folder not found: {tmp_path / 'not-written'}")):
        check_model_folder(vllm, str(tmp_path / "not-written"))
    check_model_folder(vllm, str(tmp_path))  # an existing folder is served
    check_model_folder(vllm, "Qwen/Qwen2.5-Coder-1.5B-Instruct")  # a Hub id is the engine's to fetch
    check_model_folder(get_adapter("llamacpp"), str(tmp_path / "x.gguf"))  # llama.cpp files: checked elsewhere
