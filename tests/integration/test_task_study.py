"""Issue #38 end to end: a study whose `[eval] task` is a task file of the user's own, on a real llama.cpp server
(xllamacpp, SmolLM2-135M-Instruct: F16 and Q4_0 requantized from the pinned Q4_1 file). Each arm asks the file's
items; the run's metrics and outcome string are named after the task; `compare` pairs the arms on it; `verify`
recomputes the figures from the records; the recorded weights' SHA-256 is the GGUF's and both arms share the
pinned source model, so they are paired."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.report.compare import compare_experiment
from quantrack.store.tracking import load_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ITEMS = [  # capital-city questions a 135M instruct model answers some of; the scorer is regex on the reference
    ("fr", "The capital of France is", "Paris"), ("it", "The capital of Italy is", "Rome"),
    ("jp", "The capital of Japan is", "Tokyo"), ("de", "The capital of Germany is", "Berlin"),
    ("es", "The capital of Spain is", "Madrid"), ("uk", "The capital of the United Kingdom is", "London"),
]


def test_a_study_on_a_task_file(gguf_arms: dict[str, Path], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "capitals.jsonl").write_text("".join(
        json.dumps({"id": i, "prompt": p, "reference": r}) + "\n" for i, p, r in ITEMS), encoding="utf-8")
    study = tmp_path / "study.toml"
    study.write_text(f"""
name = "cpu-task"
context_len = 512
[model]
gguf = "{gguf_arms['F16']}"
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
task = "capitals.jsonl"
scorer = "regex:([A-Z][a-z]+)"
max_tokens = 6
concurrency = 2
[[arms]]
name = "F16"
model = "{gguf_arms['F16']}"
weights = "f16"
baseline = true
[[arms]]
name = "Q4_0"
model = "{gguf_arms['Q4_0']}"
weights = "q4_0"
""", encoding="utf-8")
    ok = True
    try:
        main(["run", str(study), "--tracking-uri", uri, "--workdir", str(tmp_path / "work")])
    except SystemExit as exc:
        ok = exc.code in (0, None)
    captured = capsys.readouterr()
    assert ok, captured.err[-3000:]
    runs = {r.arm: r for r in load_runs("cpu-task", uri)}
    for arm, r in runs.items():
        assert r.metrics["capitals_n"] == 6 and "gsm8k_accuracy" not in r.metrics
        assert r.metrics["capitals_correct"] == round(r.metrics["capitals_accuracy"] * 6)
        outcomes = r.tags["quantrack.capitals_correct"]
        assert len(outcomes) == 6 and set(outcomes) <= {"0", "1"}
        assert r.tags["quantrack.capitals_data_sha256"] == hashlib.sha256(
            (tmp_path / "capitals.jsonl").read_bytes()).hexdigest()
        gguf = gguf_arms[arm]
        assert r.tags["quantrack.model_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    table = compare_experiment("cpu-task", uri=uri)
    row = {x["arm"]: x for x in table.rows}["Q4_0"]
    assert "capitals" in table.headers()
    assert row["paired_test"].startswith("McNemar p="), row
    capsys.readouterr()
    code: int | str | None = 0
    try:
        main(["verify", "--experiment", "cpu-task", "--tracking-uri", uri])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr().out
    assert code in (0, None), out[-2000:]  # exit 1 names any figure that disagrees with the records
    unchecked = [ln for ln in out.splitlines() if "not recomputed (" in ln]
    assert not any("capitals_accuracy" in ln or "capitals_ci_low" in ln for ln in unchecked), unchecked
