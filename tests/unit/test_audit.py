"""`audit`: real H200 logs (both fp8marlin logs flagged with their evidence line, the others not), runs from a
store grouped by GPU + arm, and the CLI's exit code 4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.errors import BadInput
from quantrack.report.audit import (
    AuditRow,
    add_tpot_deviation,
    audit,
    build_audit,
    render,
    rows_from_runs,
)
from quantrack.tracking import RunRow

MARLIN_WARNING = ("Your GPU does not have native support for FP8 computation but FP8 quantization is being used. "
                  "Weight-only FP8 compression will be used leveraging the Marlin kernel.")


def test_logs_flag_only_the_marlin_arms(shared_data: Path) -> None:
    report = audit(log_dirs=[shared_data / "vllm-h200", shared_data / "sglang-h200"])
    by_node = {r.node: r for r in report.rows}
    flagged = sorted(r.node for r in report.fell_back)
    assert flagged == ["sglang-0.5.16-fp8marlin.log", "vllm-0.25.0-fp8marlin.log"]
    # evidence: file:line: the real warning line (vllm log line 29, sglang log line 19)
    v = by_node["vllm-0.25.0-fp8marlin.log"]
    assert v.evidence is not None and v.evidence.startswith("vllm-0.25.0-fp8marlin.log:29: ")
    assert MARLIN_WARNING in v.evidence and "[marlin_utils_fp8.py:112]" in v.evidence
    s = by_node["sglang-0.5.16-fp8marlin.log"]
    assert s.evidence is not None and s.evidence.startswith("sglang-0.5.16-fp8marlin.log:19: [2026-11-29 11:11:26] ")
    assert MARLIN_WARNING in s.evidence
    assert v.effective_kernel == "MarlinFP8ScaledMMLinearKernel"
    assert by_node["vllm-0.25.0-fp8.log"].effective_kernel == "CutlassFP8ScaledMMLinearKernel"
    for name, r in by_node.items():
        if "fp8marlin" not in name:
            assert r.fallback is False and r.evidence is None, name
    assert report.exit_code == 4


def test_cli_exit_codes(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(shared_data / "vllm-h200"), "--format", "json"])
    assert exc.value.code == 4
    data = json.loads(capsys.readouterr().out)
    assert data["fell_back"] == ["vllm-0.25.0-fp8marlin.log"]
    # the llama.cpp CPU logs have no fallback: exit 0
    assert main(["audit", "--logs", str(shared_data / "llamacpp-cpu")]) is None
    out = capsys.readouterr().out
    assert "0 of 4 node(s) fell back" in out


def test_bad_input_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == f"quantrack: error: --logs {str(tmp_path)!r}: no *.log files"
    with pytest.raises(BadInput, match="nothing to audit"):
        audit()


def _run(host: str, arm: str, tpot: float | None, fallback: str | None, gpu: str = "NVIDIA H200") -> RunRow:
    tags = {"quantrack.arm": arm}
    if fallback is not None:
        tags["quantrack.fallback"] = fallback
    return RunRow(run_id=f"id-{host}-{arm}", experiment_id="1", run_name=arm, status="FINISHED", start_time=0,
                  end_time=None, params={"hostname": host, "gpu_name": gpu, "compute_capability": "9.0",
                                         "mig": "False", "engine": "vllm", "engine_version": "0.25.0",
                                         "quantization": "fp8"},
                  metrics={} if tpot is None else {"tpot_ms_p50": tpot}, tags=tags)


def test_tpot_against_group_median() -> None:
    # batch-1 TPOTs of the real H200 runs (client-latency-fp8*.json: 3.44, 3.52, 3.83 ms) as three fp8 nodes
    runs = [_run("n1", "fp8", 3.442091606299354, "no"), _run("n2", "fp8", 3.52, "no"),
            _run("n3", "fp8", 3.83, "yes"), _run("n4", "bf16", 4.82, "no"), _run("n5", "fp8", None, None, "NVIDIA L4")]
    report = build_audit(runs)
    by = {r.node: r for r in report.rows}
    assert by["n2"].tpot_vs_median_pct == pytest.approx(0.0)
    assert by["n3"].tpot_vs_median_pct == pytest.approx((3.83 - 3.52) / 3.52 * 100)
    assert by["n3"].group_size == 3 and by["n4"].group_size == 1
    assert by["n5"].tpot_vs_median_pct is None and by["n5"].fallback is None
    assert [r.node for r in report.fell_back] == ["n3"] and report.exit_code == 4
    text = render(report)
    assert "1 of 5 node(s) fell back (exit 4)" in text
    assert "+8.8% (of 3)" in text


def test_no_fallback_exit_zero() -> None:
    rows: list[AuditRow] = rows_from_runs([_run("n1", "fp8", 3.44, "no")])
    add_tpot_deviation(rows)
    assert build_audit([_run("n1", "fp8", 3.44, "no")]).exit_code == 0
    assert rows[0].tpot_vs_median_pct == 0.0
