"""A study with `[eval] budget` end to end on a real llama.cpp server (xllamacpp, SmolLM2-135M Q8_0): the
baseline answers every question of a small gsm8k-all pool, asked in a seeded random order; the second arm (the
same file again: greedy decoding on one CPU build agrees with itself) stops as soon as its sequential verdict
settles; the verdict and the questions it used reach MLflow, `compare` and `eval compare --sequential` of the
work files (the same verdict at the same question). A budget of 50 points is what lets 30 questions settle one
(a 1-point budget needs thousands: docs/accuracy.md); the machinery is the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.report.compare import compare_experiment
from quantrack.store.tracking import load_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_budget_study_stops_the_arm_when_settled(gguf_arms: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    study = tmp_path / "study.toml"
    q8 = gguf_arms["Q8_0"]
    study.write_text(f"""
name = "cpu-budget"
context_len = 1024
[model]
gguf = "{q8}"
[engine]
kind = "llamacpp"
ready_timeout_s = 120.0
[gpu]
name = "cpu"
[latency]
input_tokens = 16
output_tokens = 4
warmup = 0
iterations = 2
[eval]
task = "gsm8k-all"
num_questions = 30
order = "shuffled"
budget = "50pp"
num_shots = 1
max_tokens = 8
concurrency = 1
[[arms]]
name = "q8_0"
weights = "q8_0"
baseline = true
[[arms]]
name = "q8_0-again"
weights = "q8_0"
""", encoding="utf-8")
    work = tmp_path / "work"
    main_ok = True
    try:
        main(["run", str(study), "--tracking-uri", uri, "--workdir", str(work)])
    except SystemExit as exc:
        main_ok = exc.code in (0, None)
    captured = capsys.readouterr()
    assert main_ok, captured.err[-2000:]
    runs = {r.arm: r for r in load_runs("cpu-budget", uri)}
    base, again = runs["q8_0"], runs["q8_0-again"]
    assert base.metrics["gsm8k_n"] == 30  # the baseline answers every question an arm may need
    assert "quantrack.budget_verdict" not in base.tags
    assert again.tags["quantrack.budget_verdict"] == "within" and again.tags["quantrack.budget_method"] == "sequential"
    used = int(again.metrics["budget_questions_used"])
    assert 1 <= used < 30 and again.metrics["gsm8k_n"] == used  # stopped when settled (concurrency 1: none in flight)
    assert again.metrics["budget_pp"] == 50.0 and again.metrics["budget_low_pp"] > -50.0
    assert again.tags["quantrack.eval_task"] == "gsm8k-all" and again.tags["quantrack.eval_order"] == "shuffled"
    assert "budget vs q8_0: within a 50 pts budget" in captured.err
    # the questions were asked in the seeded order, train questions among them, never an exemplar (train row 0)
    recs = [json.loads(ln) for ln in (work.rglob("q8_0-gsm8k.jsonl").__next__()).read_text().splitlines()]
    ids = [r["id"] for r in recs]
    assert len(set(ids)) == 30 and ids != sorted(ids) and 100_000 not in ids
    # the same verdict from the work files, read in the order the arm answered
    arm_file = next(work.rglob("q8_0-again-gsm8k.jsonl"))
    main_args = ["eval", "compare", str(next(work.rglob("q8_0-gsm8k.jsonl"))), str(arm_file), "--budget", "50pp",
                 "--sequential", "--format", "json"]
    capsys.readouterr()
    try:
        main(main_args)
    except SystemExit as exc:
        assert exc.code in (0, None)
    got = json.loads(capsys.readouterr().out)["budget"]
    assert (got["verdict"], got["questions_used"]) == ("within", used)
    table = {r["arm"]: r for r in compare_experiment("cpu-budget", "q8_0", uri).rows}
    assert table["q8_0-again"]["budget"] == f"within 50pp n={used} (seq.)"
