"""`audit`: real H200 logs (both fp8marlin logs flagged with their evidence line, the others not), runs from a
store grouped by GPU + engine + arm (FINISHED runs only), FP8 probe node facts, and the CLI's exit code 4."""

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
from quantrack.store.records import RunRow

MARLIN_WARNING = ("Your GPU does not have native support for FP8 computation but FP8 quantization is being used. "
                  "Weight-only FP8 compression will be used leveraging the Marlin kernel.")


def test_logs_flag_only_the_marlin_arms(shared_data: Path) -> None:
    # the logs name no GPU (SGLang prints no FP8 kernel line either): the fleet's GPU comes from --gpu
    report = audit(log_dirs=[shared_data / "vllm-h200", shared_data / "sglang-h200"], gpu="H200")
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


def _run(host: str, arm: str, tpot: float | None, fallback: str | None, gpu: str = "NVIDIA H200",
         engine: str = "vllm", status: str = "FINISHED") -> RunRow:
    tags = {"quantrack.arm": arm}
    if fallback is not None:
        tags["quantrack.fallback"] = fallback
    return RunRow(run_id=f"id-{host}-{arm}-{engine}-{status}", experiment_id="1", run_name=arm, status=status,
                  start_time=0, end_time=None,
                  params={"hostname": host, "gpu_name": gpu, "compute_capability": "9.0", "mig": "False",
                          "engine": engine, "engine_version": "0.25.0", "quantization": "fp8", "weights": "fp8"},
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


def test_engines_are_not_pooled() -> None:
    """vLLM and SGLang runs of the same arm on the same GPU are different groups (batch-1 TPOTs of the real
    H200 fp8-marlin runs: vLLM 3.23 ms, SGLang 3.25 ms; docs/gpu/audit.txt pooled them as '(of 2)')."""
    runs = [_run("a", "fp8-marlin", 3.23, "yes"), _run("b", "fp8-marlin", 3.40, "yes"),
            _run("a", "fp8-marlin", 3.25, "yes", engine="sglang")]
    by = {(r.node, r.engine): r for r in build_audit(runs).rows}
    assert by[("a", "sglang")].group_size == 1 and by[("a", "sglang")].tpot_vs_median_pct == 0.0
    assert by[("a", "vllm")].group_size == 2
    assert by[("a", "vllm")].tpot_vs_median_pct == pytest.approx((3.23 - 3.315) / 3.315 * 100)


def test_failed_run_shown_failed_and_out_of_the_median() -> None:
    runs = [_run("n1", "fp8", 3.44, "no"), _run("n2", "fp8", 3.52, "no"),
            _run("n3", "fp8", 9.90, "no", status="FAILED"), _run("n4", "bf16", None, "no", status="FAILED")]
    report = build_audit(runs)
    by = {r.node: r for r in report.rows}
    assert by["n1"].group_size == 2 and by["n1"].tpot_vs_median_pct == pytest.approx((3.44 - 3.48) / 3.48 * 100)
    assert by["n3"].status == "FAILED" and by["n3"].tpot_vs_median_pct is None and by["n3"].group_size is None
    text = render(report)
    n4 = next(ln for ln in text.splitlines() if ln.startswith("n4"))
    assert n4.split()[-3:] == ["excluded", "(FAILED)", "FAILED"]
    assert "2 run(s) not FINISHED, kept out of the medians" in text
    rejected = RunRow(**{**_run("n5", "fp8", None, None, status="KILLED").__dict__,
                         "tags": {"quantrack.arm": "fp8", "quantrack.verdict": "reject"}})
    assert build_audit([rejected]).rows[0].status == "rejected"


def _probe(host: str, verdict: str, start: int, gpu: str = "NVIDIA L4") -> RunRow:
    """A node-fact run as `quantrack probe --track` logs it (quantrack.store.tracking.log_node_fact)."""
    return RunRow(run_id=f"probe-{host}-{start}", experiment_id="9", run_name=f"probe@{host}", status="FINISHED",
                  start_time=start, end_time=None, params={"node_hostname": host, "gpu_name": gpu},
                  metrics={}, tags={"quantrack.role": "node-fact", "quantrack.fact": "probe",
                                    "probe.verdict": verdict})


def test_fp8_probe_column_and_warning() -> None:
    runs = [_run("l4-a", "fp8", 3.5, "no", gpu="NVIDIA L4"), _run("h200-b", "fp8", 3.4, "no"),
            _run("l4-c", "bf16", 4.8, "no", gpu="NVIDIA L4")]
    runs[2].params.update({"quantization": "none", "weights": "bf16"})
    facts = [_probe("l4-a", "native", 1), _probe("l4-a", "none", 2), _probe("h200-b", "native", 1, "NVIDIA H200"),
             _probe("l4-c", "none", 1)]
    report = build_audit(runs, node_facts=facts)
    by = {r.node: r for r in report.rows}
    assert by["l4-a"].fp8_probe == "none" and by["l4-a"].fp8_probe_run == "probe-l4-a-2"  # the newest probe
    assert by["h200-b"].fp8_probe == "native"
    # one warning: the FP8 W8A8 arm on the node without native FP8; the bf16 arm on such a node is fine
    assert len(report.warnings) == 1
    assert report.warnings[0].startswith("WARNING l4-a: FP8 probe (run probe-l4-a-2) found no native FP8 on "
                                         "NVIDIA L4, but arm fp8 (run id-l4-a-fp8-vllm-FINISHED) requested FP8 W8A8")
    assert report.exit_code == 0  # evidence, not a fallback
    text = render(report)
    assert report.warnings[0] in text
    head = text.splitlines()[0]
    assert head.split()[9:12] == ["Fallback", "FP8", "probe"]
    col = head.index("FP8 probe")
    row = next(ln for ln in text.splitlines() if ln.startswith("l4-a"))
    assert row[col:].split()[0] == "none"
    without = build_audit(runs)
    assert {r.fp8_probe for r in without.rows} == {None} and "—" in render(without)


H200_STORE = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "h200-mlflow-store-session1.tar.gz"


def test_real_h200_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real H200 store: vLLM + SGLang studies and three `probe --track` runs of node 'vm' (native)."""
    import tarfile

    if not H200_STORE.is_file():
        pytest.skip(f"{H200_STORE} not present")
    with tarfile.open(H200_STORE) as tar:
        tar.extractall(tmp_path, filter="data")
    uri = f"sqlite:///{tmp_path}/qt-mlruns/mlflow.db"
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--experiment", "h200-vllm", "--experiment", "h200-sglang", "--tracking-uri", uri,
              "--format", "json"])
    assert exc.value.code == 4  # the forced-Marlin arms fell back
    data = json.loads(capsys.readouterr().out)
    nodes = data["nodes"]
    assert {n["fp8_probe"] for n in nodes} == {"native"} and data["fp8_probes"]["vm"]["verdict"] == "native"
    marlin = {n["engine"]: n for n in nodes if n["arm"] == "fp8-marlin"}
    assert marlin["vllm"]["group_size"] == 1 and marlin["sglang"]["group_size"] == 1  # not pooled
    failed = [n for n in nodes if n["status"] == "FAILED"]
    assert len(failed) == 1 and failed[0]["arm"] == "bf16" and failed[0]["engine"] == "sglang"
    assert failed[0]["tpot_vs_median_pct"] is None
    ok_bf16 = [n for n in nodes if n["arm"] == "bf16" and n["engine"] == "sglang" and n["status"] == "FINISHED"]
    assert len(ok_bf16) == 1 and ok_bf16[0]["group_size"] == 1
    # the fallbacks happened on a node whose probe measured native FP8: said as a note, not as a GPU fault
    assert sum(w.startswith("NOTE vm: arm fp8-marlin") for w in data["warnings"]) == 2
    # every run here was on a host named vm: each row is named by its run id as well, and the page says why
    assert [n["label"] for n in nodes] == [f"vm/{n['source'][:8]}" for n in nodes]
    assert len({n["label"] for n in nodes}) == len(nodes)
    assert data["node_notes"] == [
        (f"hostname 'vm' is shared by {len(nodes)} runs: each named vm/<run id prefix> (these runs record no machine "
        "id beyond the hostname, so whether they ran on one machine is not known; the FP8 probe column matches "
        "nodes by hostname).")]


def test_shared_hostnames_are_told_apart_and_findings_name_the_arm() -> None:
    """Issue #44: audit named every node `vm` (the hostname of every host here) and its lines did not say which
    arm they were about."""
    from quantrack.report.audit import label_nodes

    runs = [_run("vm", "fp8", 3.44, "no"), _run("vm", "fp8-marlin", 3.83, "yes"), _run("gpu-7", "bf16", 4.82, "no")]
    runs[0].tags.update({"quantrack.latency_contention": "yes",
                         "quantrack.latency_contention_reasons": "other processes used 1.6 of 2 cores"})
    report = build_audit(runs)
    by = {r.source: r for r in report.rows}
    fp8, marlin, bf16 = (by[r.run_id] for r in runs)
    assert fp8.node == marlin.node == "vm"  # the hostname itself is kept (json "node", FP8 probes match on it)
    # run ids id-vm-fp8-vllm-FINISHED and id-vm-fp8-marlin-vllm-FINISHED: 8 characters would not tell them apart
    assert (fp8.label, marlin.label) == ("vm/id-vm-fp8-v", "vm/id-vm-fp8-m")
    assert bf16.label == "gpu-7"  # a hostname of its own is name enough
    text = render(report)
    rows = [ln.split()[0] for ln in text.splitlines()[2:5]]
    assert rows == [fp8.label, marlin.label, "gpu-7"]
    assert (f"⚠ CONTENTION {fp8.label} arm fp8 (vllm): TPOT measured under contention (other processes used 1.6 of "
            "2 cores)") in text
    assert f"FALLBACK {marlin.label} arm fp8-marlin (vllm): " in text
    assert "hostname 'vm' is shared by 2 runs: each named vm/<run id prefix> (these runs record no machine id beyond " \
           "the hostname, so whether they ran on one machine is not known)." in text
    # a fleet job records its Ray node: two Ray nodes named vm are two machines, one Ray node is one machine
    rows = rows_from_runs(runs[:2])
    rows[0].ray_node_id, rows[1].ray_node_id = "a1b2c3d4e5f6", "f6e5d4c3b2a1"
    assert label_nodes(rows) == [("hostname 'vm' is shared by 2 runs: named vm@ray:<Ray node id> where the run "
                                 "recorded one.")]
    assert [r.label for r in rows] == ["vm@ray:a1b2c3d4", "vm@ray:f6e5d4c3"]
    rows[1].ray_node_id = rows[0].ray_node_id
    assert label_nodes(rows) == [] and [r.label for r in rows] == ["vm", "vm"]
    rows[1].ray_node_id = None
    assert label_nodes(rows) == [("hostname 'vm' is shared by 2 runs: named vm@ray:<Ray node id> where the run "
                                 "recorded one, else vm/<run id prefix> (1 of them record no machine id beyond the "
                                 "hostname, so whether they ran on one machine is not known).")]
    assert [r.label for r in rows] == ["vm@ray:a1b2c3d4", "vm/id-vm-fp"]  # alone without a Ray id: 8 characters
