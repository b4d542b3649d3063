"""`quantrack run` end to end on a real llama.cpp server (xllamacpp, SmolLM2-135M GGUF arms from conftest):
every arm preflighted, served by quantrack, measured and logged as a nested MLflow run in a fresh store;
a rejected arm is logged as rejected and never started; an arm whose server cannot start is logged FAILED
with what it measured. Exit codes 1 (an arm failed) and 3 (an arm rejected, none failed); the compare table on
stdout with the per-arm lines last; `--arm` repeatable. Lean on purpose (2-core machine): tiny latency and
GSM8K settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.report.compare import FILL, compare_experiment
from quantrack.store.tracking import load_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_run_study_llamacpp(gguf_arms: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("xllamacpp")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    study = tmp_path / "study.toml"
    # an arm whose file exists but is no GGUF: the engine fails to load it (a missing file is refused up front, exit 2)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file\n" * 64)
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
model = "{broken}"
""", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--tracking-uri", uri, "--workdir", str(tmp_path / "work")])
    assert exc.value.code == 1  # one arm failed (and one was rejected: failure wins)
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    lines = dict(ln.split("\t")[:2] for ln in out[-4:])  # the per-arm lines come last
    assert lines == {"q8_0": "FINISHED", "q4_0": "FINISHED", "fp8": "KILLED", "broken": "FAILED"}
    assert "[q8_0] preflight: allow" in captured.err and "[fp8] preflight: reject" in captured.err
    assert "hf_testtokenvalue" not in captured.err + captured.out
    assert captured.err.strip().splitlines()[-1] == "quantrack: 1 arm(s) failed: broken"
    # the compare table of this study goes to stdout, not among the progress lines
    assert out[0] == "experiment: cpu-smollm2   baseline: q8_0"
    head = out[1]
    # the default (narrow) table: its capacity column reads "KV tokens" or "KV MiB" by what was logged
    assert head.startswith("Arm ") and " KV " in head and "GSM8K" in head and "GSM8K [" not in captured.err
    q8_row = next(ln for ln in out if ln.startswith("q8_0 "))
    assert q8_row[head.index(" KV "):].split()[0] != FILL.split()[0]  # llama.cpp logs its KV cache
    assert re.search(r" \d+\.\d% \[\d+–\d+\] ", q8_row)  # GSM8K: accuracy [Wilson interval] (n=3: below)

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
    # measurement hygiene of the timed steps: sampled (the engine's own CPU measured apart), state said
    assert "quantrack.sweep_contention" not in q8.tags  # this study has no sweep
    for step in ("latency",):
        assert q8.tags[f"quantrack.{step}_contention"] in ("yes", "no"), step
        assert q8.metrics[f"{step}_host_samples"] >= 2 and f"{step}_host_others_cpu_cores" in q8.metrics
        assert q8.metrics[f"{step}_host_engine_cpu_cores"] > 0  # the engine tree was watched, not counted as others
    assert "tpot_cv" in q8.metrics
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
    from quantrack.store.tracking import read_artifact_text

    env = read_artifact_text(q8.run_id, "launch/env.json", uri) or ""
    assert "HF_TOKEN" in env and "hf_testtokenvalue" not in env

    # --arm is repeatable: both named arms run (not only the last); a rejection without a failure is exit 3
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--arm", "q4_0", "--arm", "fp8", "--tracking-uri", uri, "--format", "tsv",
              "--workdir", str(tmp_path / "work2")])
    assert exc.value.code == 3
    captured = capsys.readouterr()
    # the baseline (q8_0) runs first although not named (compare and report need it)
    assert [ln.split("\t")[:2] for ln in captured.out.strip().splitlines()] == [["q8_0", "FINISHED"],
                                                                                ["q4_0", "FINISHED"],
                                                                                ["fp8", "KILLED"]]
    assert captured.err.strip().splitlines()[-1] == "quantrack: 1 arm(s) rejected by preflight: fp8"
    # compare shows q4_0's newest FINISHED run and counts the first one as skipped
    t = compare_experiment("cpu-smollm2", "q8_0", uri)
    assert t.skipped["q4_0"] == {"FINISHED": 1} and t.skipped["fp8"] == {"KILLED": 1}
    assert next(v for v in t.raw if v["arm"] == "q4_0")["run_id"] == captured.out.splitlines()[1].split("\t")[2]


def test_rejected_only_exit_3_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No server needed: a study whose only selected arm is rejected exits 3; a bad --prices file is exit 2
    before anything is logged."""
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    study = tmp_path / "study.toml"
    # the file exists (a missing one is refused before anything, exit 2) but is never served: the only arm asked for
    # is the baseline, rejected by preflight
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    study.write_text("""
name = "cpu-reject"
[model]
gguf = "model.gguf"
[engine]
kind = "llamacpp"
[gpu]
name = "cpu"
[[arms]]
name = "q8_0"
weights = "q8_0"
[[arms]]
name = "fp8"
weights = "fp8"
quantization = "fp8"
baseline = true
""", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--arm", "fp8", "--tracking-uri", uri, "--workdir", str(tmp_path / "w")])
    assert exc.value.code == 3
    assert capsys.readouterr().out.strip().splitlines()[-1].split("\t")[:2] == ["fp8", "KILLED"]
    bad = tmp_path / "prices.toml"
    bad.write_text("price = 1\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--arm", "fp8", "--tracking-uri", uri, "--prices", str(bad)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (f"quantrack: error: prices file {str(bad)!r}: needs at least one "
                                               "[[price]] table")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--ray", "--arm", "fp8"])
    assert exc.value.code == 2
    assert "--ray runs every (GPU x arm) job of the study" in capsys.readouterr().err


def test_run_ray_flag_calls_the_fleet_runner(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ray` alone means "auto"; the fleet runner's summary lines are printed; a job not FINISHED is exit 1.
    (The fleet runner itself runs on a real Ray cluster in test_ray_fleet.py; here only the CLI's wiring.)"""
    from quantrack.fleet import ray_runner

    calls = []

    def fake(study: object, address: str | None, tracking_uri: str | None, **kw: object) -> ray_runner.FleetResult:
        calls.append((address, tracking_uri))
        kw["progress"]("ran on the fake cluster")  # type: ignore[operator]
        return ray_runner.FleetResult(study="s", experiment="s", tracking_uri=str(tracking_uri), parent_run_id="p",
                                      results=[ray_runner.JobResult(key="H100/bf16", gpu="H100", arm="bf16",
                                                                    status="FINISHED", run_id="r1"),
                                               ray_runner.JobResult(key="H100/fp8", gpu="H100", arm="fp8",
                                                                    status="FAILED", error="node lost")])

    monkeypatch.setattr(ray_runner, "run_study_on_ray", fake)
    study = tmp_path / "study.toml"
    study.write_text('name = "s"\n[model]\nname = "Llama-3-8B"\n[engine]\nkind = "vllm"\n[gpu]\nname = "H100"\n'
                     '[[arms]]\nname = "bf16"\nweights = "bf16"\n', encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        main(["run", str(study), "--ray", "--tracking-uri", "sqlite:///x.db"])
    assert exc.value.code == 1 and calls == [("auto", "sqlite:///x.db")]
    cap = capsys.readouterr()
    assert cap.out.splitlines() == ["H100/bf16\tFINISHED\tr1", "H100/fp8\tFAILED\t-: node lost"]
    assert "quantrack: ran on the fake cluster" in cap.err
    calls.clear()
    with pytest.raises(SystemExit):
        main(["run", str(study), "--ray", "ray://head:10001"])
    assert calls == [("ray://head:10001", None)]
