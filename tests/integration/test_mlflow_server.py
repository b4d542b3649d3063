"""A real `mlflow server` (SQLite backend) on 127.0.0.1: `quantrack log` writes an arm run with real H200 data,
and the REST API the UI uses (/api/2.0/mlflow/runs/search) shows its params, metrics, tags and artifacts."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.cli import main
from tests.integration.mlflow_fixtures import MlflowServer, run_fields

pytestmark = pytest.mark.integration
STUDY = Path(__file__).resolve().parents[1] / "data" / "tracking" / "vllm-h200.toml"


def test_log_then_read_back_over_rest(shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = shared_data / "vllm-h200"
    with MlflowServer(f"sqlite:///{tmp_path}/server.db", tmp_path / "artifacts", tmp_path / "server.log") as srv:
        assert main(["log", "--study", str(STUDY), "--arm", "fp8marlin", "--latency",
                     str(d / "client-latency-fp8marlin.json"), "--server-log", str(d / "vllm-0.25.0-fp8marlin.log"),
                     "--tracking-uri", srv.url]) is None
        out = capsys.readouterr().out
        assert out.startswith("fp8marlin\tFINISHED\t")
        runs = srv.search_runs("vllm-h200-llama8b")
        assert len(runs) == 1
        run = run_fields(runs[0])
        assert run["status"] == "FINISHED" and run["name"] == "fp8marlin"
        p, m, t = run["params"], run["metrics"], run["tags"]
        assert (p["engine"], p["engine_version"], p["weights"], p["quantization"]) == ("vllm", "0.25.0", "fp8", "fp8")
        assert p["max_model_len"] == "8192" and p["input_tokens"] == "1024"
        # vllm-0.25.0-fp8marlin.log: "Model loading took 8.49 GiB", "GPU KV cache size: 973,168 tokens"
        assert m["weights_gib"] == 8.49 and m["kv_tokens_reported"] == 973168
        assert m["tpot_ms_p50"] == pytest.approx(3.8257, abs=1e-3)  # client-latency-fp8marlin.json batch1
        assert m["sweep_output_tps_c64"] == pytest.approx(1671.5, abs=0.1)
        assert "kv_tokens_predicted" in m and "capacity_error_pct" in m
        assert t["quantrack.fallback"] == "yes" and t["quantrack.fallback_kinds"] == "fp8_marlin"
        assert t["quantrack.fallback_evidence"].startswith("vllm-0.25.0-fp8marlin.log:29: ")
        assert t["quantrack.effective_kernel"] == "MarlinFP8ScaledMMLinearKernel"
        assert t["quantrack.version"] and t["quantrack.git_revision"]
        assert "gsm8k_accuracy" not in m  # not measured: never logged
        arts = srv.list_artifacts(runs[0]["info"]["run_id"])
        assert arts == ["latency/latency.json", "server/log_report.json", "server/vllm-0.25.0-fp8marlin.log"]
