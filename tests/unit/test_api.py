"""The notebook API (quantrack.api): the commands' results as DataFrames and typed objects, equal to what the
commands print. Runs are logged from the real vLLM H200 files (tests/data/real/vllm-h200) into a temporary store."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from quantrack import api
from quantrack.cli import main
from quantrack.errors import BadInput
from quantrack.runner import LogInputs, log_results
from quantrack.study import Study, load_study

DATA = Path(__file__).resolve().parents[1] / "data"
STUDY = DATA / "tracking" / "vllm-h200.toml"
EXPERIMENT = "vllm-h200-llama8b"


@pytest.fixture(scope="module")
def store_uri(real_data: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('api-store')}/mlflow.db"
    study = load_study(STUDY)
    d = real_data / "vllm-h200"
    for arm in ("bf16", "fp8", "fp8kv", "fp8marlin"):
        latency = d / f"client-latency-{arm}.json" if arm != "fp8marlin" else None
        log_results(LogInputs(study=study, arm=arm, latency=latency, server_log=d / f"vllm-0.25.0-{arm}.log",
                              tracking_uri=uri))
    return uri


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return b is None
    return a == b


def test_compare_frame_is_the_commands_numbers(store_uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    df = api.compare(EXPERIMENT, tracking_uri=store_uri)
    main(["compare", "--experiment", EXPERIMENT, "--tracking-uri", store_uri, "--format", "json"])
    printed = json.loads(capsys.readouterr().out)
    raw = {r["arm"]: r for r in printed["values"]}
    assert sorted(df["arm"]) == ["bf16", "fp8", "fp8kv", "fp8marlin"]
    assert set(df["baseline"]) == {"bf16"}
    by_arm = df.set_index("arm")
    # the capacity the engine logged (measured): vLLM's "GPU KV cache size: N tokens" lines
    assert by_arm.loc["bf16", "metrics.kv_tokens_reported"] == 920192
    assert by_arm.loc["fp8kv", "metrics.kv_tokens_reported"] == 1945728
    assert by_arm.loc["fp8marlin", "fallback"] == "yes" and by_arm.loc["fp8", "fallback"] == "no"
    assert by_arm.loc["bf16", "metrics.tpot_ms_p50"] == pytest.approx(4.8194, abs=1e-4)
    assert math.isnan(by_arm.loc["fp8marlin", "metrics.tpot_ms_p50"])  # no latency file logged: NaN, not a number
    assert math.isnan(by_arm.loc["bf16", "metrics.gsm8k_accuracy"])  # no eval logged: NaN (FILL IN in the table)
    assert set(raw) == set(by_arm.index)
    for arm, r in raw.items():
        for k, v in r["metrics"].items():
            assert _same(by_arm.loc[arm, f"metrics.{k}"], v), (arm, k)
    assert df.attrs["columns"]["tpot_ms"].startswith("measured")
    assert any("FILL IN = not measured" in n for n in df.attrs["notes"])


def test_runs_frame(store_uri: str) -> None:
    df = api.runs(EXPERIMENT, tracking_uri=store_uri)
    assert len(df) == 4 and set(df["status"]) == {"FINISHED"}
    assert {"params.weights", "metrics.kv_tokens_reported", "tags.quantrack.arm"} <= set(df.columns)
    assert str(df["start_time"].dtype).startswith("datetime64")


def test_audit_frame(real_data: Path) -> None:
    df = api.audit(log_dirs=[real_data / "vllm-h200", real_data / "sglang-h200"])
    assert sorted(df.attrs["fell_back"]) == ["sglang-0.5.16-fp8marlin.log", "vllm-0.25.0-fp8marlin.log"]
    assert df.attrs["exit_code"] == 4
    marlin = df.set_index("node").loc["vllm-0.25.0-fp8marlin.log"]
    assert marlin["effective_kernel"] == "MarlinFP8ScaledMMLinearKernel" and bool(marlin["fallback"])
    with pytest.raises(BadInput, match="audit needs"):
        api.audit()


def test_plan_frame_is_quantrack_plan(capsys: pytest.CaptureFixture[str]) -> None:
    df = api.plan("Llama-3-8B", gpu="H100", arms=["bf16", "fp8-kv"], engine="vllm", context_len=8192)
    main(["plan", "--model", "Llama-3-8B", "--gpu", "H100", "--arm", "bf16", "--arm", "fp8-kv", "--engine", "vllm",
          "--context-len", "8192", "--format", "json"])
    printed = json.loads(capsys.readouterr().out)
    assert df.to_dict("records") == printed
    assert df.attrs["title"].startswith("Capacity plan for Llama-3-8B: derived, not measured")
    with pytest.raises(BadInput, match=r"^tp: expected an integer in 1..72 \(the GPUs of one NVLink domain, GB200 NVL72\), got 0$"):
        api.plan("Llama-3-8B", gpu="H100", tp=0)
    with pytest.raises(BadInput, match="give gpu= .* or vram="):
        api.plan("Llama-3-8B")


def test_study_and_preflight_are_typed_objects() -> None:
    study = api.load_study(STUDY)
    assert isinstance(study, Study) and study.baseline.name == "bf16"
    report = api.preflight(STUDY, gpu="H200")
    assert report.verdict in ("allow", "warn", "reject") and {r.arm for r in report.results} == {
        a.name for a in study.arms}


def test_import_api_does_not_import_pandas() -> None:
    code = "import sys, quantrack.api; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'mlflow')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=600).stdout
    assert out.strip() == "[]"
