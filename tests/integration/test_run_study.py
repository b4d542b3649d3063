"""`quantrack run` end to end on a real llama.cpp server (xllamacpp, SmolLM2-135M GGUF arms from conftest):
every arm preflighted, served by quantrack, measured and logged as a nested MLflow run in a fresh store;
a rejected arm is logged as rejected and never started; an arm whose server cannot start is logged FAILED
with what it measured. Lean on purpose (2-core machine): tiny latency and GSM8K settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.report.compare import FILL, compare_experiment
from quantrack.tracking import load_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_run_study_llamacpp(gguf_arms: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    study = tmp_path / "study.toml"
    study.write_text(f"""
name = "cpu-smollm2"
context_len = 2048
parallel = 1
[model]
gguf = "{gguf_arms['Q8_0']}"
[engine]
kind = "llamacpp"
ready_timeout_s = 120.0
env = {{ HF_TOKEN = "hf_testtokenvalue0123456789abcdef" }}
[gpu]
name = "cpu"
[latency]
input_tokens = 32
output_tokens = 8
warmup = 1
iterations = 3
[eval]
task = "gsm8k"
num_questions = 3
num_shots = 1
max_tokens = 16
concurrency = 1
[[arms]]
name = "q8_0"
weights = "q8_0"
model = "{gguf_arms['Q8_0']}"
[[arms]]
name = "q4_0"
weights = "q4_0"
model = "{gguf_arms['Q4_0']}"
[[arms]]
name = "fp8"
weights = "fp8"
quantization = "fp8"
[[arms]]
name = "broken"
weights = "q4_0"
model = "{tmp_path / 'missing.gguf'}"
""", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--tracking-uri", uri, "--workdir", str(tmp_path / "work")])
    assert exc.value.code == 1  # one arm failed
    captured = capsys.readouterr()
    lines = dict(ln.split("\t")[:2] for ln in captured.out.strip().splitlines())
    assert lines == {"q8_0": "FINISHED", "q4_0": "FINISHED", "fp8": "KILLED", "broken": "FAILED"}
    assert "[q8_0] preflight: allow" in captured.err and "[fp8] preflight: reject" in captured.err
    assert "hf_testtokenvalue" not in captured.err + captured.out

    runs = {r.arm: r for r in load_runs("cpu-smollm2", uri)}
    parent = load_runs("cpu-smollm2", uri, role="study")
    assert len(parent) == 1 and parent[0].status == "FAILED"  # an arm failed
    for name in ("q8_0", "q4_0", "fp8", "broken"):
        assert runs[name].tags["mlflow.parentRunId"] == parent[0].run_id
    q8 = runs["q8_0"]
    assert q8.status == "FINISHED" and q8.params["engine"] == "llamacpp"
    # measured by the run itself: weights from the log, latency from the client, GSM8K from 3 questions
    for key in ("weights_gib", "kv_tokens_reported", "tpot_ms_p50", "ttft_ms_p50", "itl_ms_p99",
                "gsm8k_accuracy", "gsm8k_se", "gsm8k_n", "server_tpot_ms"):
        assert key in q8.metrics, key
    assert q8.metrics["gsm8k_n"] == 3 and q8.tags["quantrack.fallback"] == "no"
    assert len(q8.tags["quantrack.gsm8k_correct"]) == 3
    assert "gsm8k_delta_vs_baseline" in runs["q4_0"].metrics
    assert runs["fp8"].status == "KILLED" and runs["fp8"].tags["quantrack.verdict"] == "reject"
    assert "llamacpp-gguf-only" in runs["fp8"].tags["quantrack.rule_ids"]
    assert "weights_gib" not in runs["fp8"].metrics  # never started
    b = runs["broken"]
    assert b.status == "FAILED" and b.tags["quantrack.failed_step"] == "serve"
    assert b.tags["quantrack.verdict"] == "allow"

    table = {r["arm"]: r for r in compare_experiment("cpu-smollm2", "q8_0", uri).rows}
    assert table["q4_0"]["paired_test"].startswith("McNemar p=")
    assert table["fp8"]["status"] == "rejected" and table["fp8"]["gsm8k"] == FILL
    assert table["broken"]["status"] == "FAILED"
    # the secret in [engine] env never reaches the store
    from quantrack.tracking import read_artifact_text

    env = read_artifact_text(q8.run_id, "launch/env.json", uri) or ""
    assert "HF_TOKEN" in env and "hf_testtokenvalue" not in env
