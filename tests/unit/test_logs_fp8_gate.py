"""The GPU gate (issue 41): FP8 weights on a GPU without FP8 tensor cores (compute capability < 8.9) run the engine's
weight-only FP8 Marlin path, so the audit never reads such a node as a clean FP8 path: a fallback when the GPU is
known (the rule is the evidence), unknown with the reason when it is not, clean only with a native FP8 kernel line.

Real lines: tests/data/fp8-gate/ (club-3090#1011, two RTX-3090-class Ampere GPUs, with its URL in the .meta; the
``-warning-cut`` file is the same excerpt less its one Marlin warning line, as its .meta says). The vLLM 0.33 lines of
``_formatted_log`` are filled in from the format strings quoted in engine-facts §1.1: "Initializing a V1 LLM engine
(v%s) with config: %s" (vllm@4ba787ec9:vllm/v1/engine/core.py:L140), "Model loading took %s GiB memory and %.6f
seconds" (vllm@4ba787ec9:vllm/v1/worker/gpu_model_runner.py:L5089), "Selected %s for %s"
(vllm@4ba787ec9:vllm/model_executor/kernels/linear/__init__.py:L818).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantrack.arms import make_arm
from quantrack.cli import main
from quantrack.engines import parse_log_file
from quantrack.hardware.rulebook import NodeFacts, check_rules, fallback_gate, forced_fallbacks, parse_cc, report_gate
from quantrack.report.audit import audit, build_audit, log_verdict
from quantrack.store.records import RunRow

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "tests" / "data" / "fp8-gate"
WITH_LINE = GATE / "vllm-club3090-1011-fp8-marlin.log"
CUT = GATE / "vllm-club3090-1011-fp8-warning-cut.log"
PREFIX = "(EngineCore pid=7) INFO 12-03 10:00:0{} [{}] "


def _formatted_log(tmp: Path, kernel: str | None = None) -> Path:
    lines = [PREFIX.format(1, "core.py:140") + "Initializing a V1 LLM engine (v0.33.0) with config: model='m', "
             "tokenizer='m', dtype=torch.bfloat16, max_seq_len=4096, tensor_parallel_size=1, quantization=fp8, "
             "enforce_eager=False, kv_cache_dtype=auto, device_config=cuda"]
    if kernel:
        lines.append(PREFIX.format(2, "__init__.py:818") + f"Selected {kernel} for Fp8LinearMethod")
    lines.append(PREFIX.format(3, "gpu_model_runner.py:5089") + "Model loading took 8.49 GiB memory and 3.100000 seconds")
    d = tmp / ("native" if kernel else "bare")
    d.mkdir()
    p = d / "node.log"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("path", [WITH_LINE, CUT], ids=["with-line", "warning-cut"])
def test_the_excerpts_read_as_stated(path: Path) -> None:
    meta = (GATE / f"{path.name}.meta").read_text()
    assert "# source: https://github.com/noonghunna/club-3090/issues/1011" in meta
    assert "written before the parser was run" in meta
    want = json.loads((GATE / f"{path.stem}.expect.json").read_text())
    r = parse_log_file(path)
    assert r.engine == want["engine"] and r.quantization == want["quantization"]
    assert r.kv_cache_dtype == want["kv_cache_dtype"]
    assert sorted(e.kind for e in r.fallbacks) == want["fallbacks"]
    # the cut file is the other one less exactly its Marlin line
    assert CUT.read_text().splitlines() == [ln for ln in WITH_LINE.read_text().splitlines()
                                            if "marlin_utils_fp8.py:112" not in ln]


def test_rules_name_the_fallback_the_gpu_forces() -> None:
    assert check_rules() == []
    fp8 = make_arm("fp8", weights="fp8", quantization="fp8")
    for cc, vllm, sglang in ((86, ["vllm-fp8-marlin-fallback"], ["sglang-fp8-marlin-auto"]),
                             (80, ["vllm-fp8-marlin-fallback"], ["sglang-fp8-marlin-auto"]),
                             (89, [], []), (90, [], []), (None, [], [])):
        node = NodeFacts(name="g", vendor="nvidia", cc=cc)
        assert [r.id for r in forced_fallbacks(node, fp8, "vllm")] == vllm, cc
        assert [r.id for r in forced_fallbacks(node, fp8, "sglang")] == sglang, cc
    assert {r.fallback for r in forced_fallbacks(NodeFacts("g", "nvidia", cc=86), fp8, "vllm")} == {"fp8_marlin"}
    # bf16 weights: nothing forced
    assert forced_fallbacks(NodeFacts("g", "nvidia", cc=86), make_arm("bf16"), "vllm") == []


def test_a_bad_fallback_key_is_a_rulebook_problem(tmp_path: Path) -> None:
    src = ROOT / "quantrack" / "rules"
    for f in src.glob("*.toml"):
        shutil.copy(f, tmp_path)
    (tmp_path / "rules-zz.toml").write_text(
        '[[rule]]\nid = "x-allow"\nverdict = "allow"\nmessage = "m"\nsource = "s"\nfallback = "fp8_marlin"\n'
        '[[rule]]\nid = "x-bad"\nverdict = "warn"\nmessage = "m"\nsource = "s"\nfallback = "FP8 Marlin"\n')
    problems = check_rules(tmp_path)
    assert "rules-zz.toml: rule 'x-allow': 'fallback' on an allow rule: a forced fallback is a warn or a reject" \
        in problems
    assert ("rules-zz.toml: rule 'x-bad': 'fallback' must be a fallback kind (lower-case letters, digits, '_'), "
            "got 'FP8 Marlin'") in problems


def test_the_warning_line_is_its_own_evidence() -> None:
    rep = parse_log_file(WITH_LINE)
    assert log_verdict(rep) == (True, None)
    row = audit(log_dirs=[GATE]).rows[0]
    assert row.node == WITH_LINE.name and row.fallback is True and row.fallback_kinds == "fp8_marlin"
    assert row.evidence is not None and row.evidence.startswith(f"{WITH_LINE.name}:10: (Worker_TP0 pid=128) WARNING")


def test_a_3090_log_without_the_warning_is_a_fallback_once_the_gpu_is_known(tmp_path: Path) -> None:
    shutil.copy(CUT, tmp_path)
    # no GPU named: not clean (the log also stops before any loaded figure)
    row = audit(log_dirs=[tmp_path]).rows[0]
    assert row.fallback is None and row.unknown_reason
    # the fleet's GPU given: the rulebook's gate decides, and says which rule
    row = audit(log_dirs=[tmp_path], gpu="RTX 3090").rows[0]
    assert row.fallback is True and row.fallback_kinds == "fp8_marlin" and row.unknown_reason is None
    assert row.gpu == "RTX 3090"  # the log names none: the row shows the one --gpu gave
    assert row.evidence == (
        f"{CUT.name}: rule vllm-fp8-marlin-fallback: FP8 weights on RTX 3090 (compute capability 8.6): rule "
        "vllm-fp8-marlin-fallback says vllm runs them as fp8_marlin (no FP8 tensor cores below 8.9), whether or not "
        "the log shows the warning")


def test_a_loaded_fp8_log_is_clean_only_with_evidence_of_the_native_path(tmp_path: Path) -> None:
    bare = _formatted_log(tmp_path)
    rep = parse_log_file(bare)
    assert rep.quantization == "fp8" and log_verdict(rep) == (False, None)  # what the audit called clean before
    row = audit(log_dirs=[bare.parent]).rows[0]
    assert row.fallback is None
    assert row.unknown_reason == (
        "FP8 weights on a GPU the log does not name (audit --gpu names it): below compute capability 8.9 vllm runs FP8 weights "
        "as weight-only FP8 via Marlin, and the log shows neither that warning nor a native FP8 kernel line")
    assert audit(log_dirs=[bare.parent], gpu="A100-80GB").rows[0].fallback is True
    assert audit(log_dirs=[bare.parent], gpu="H200").rows[0].fallback is False  # SM90: the gates say native
    native = _formatted_log(tmp_path, "CutlassFP8ScaledMMLinearKernel")
    row = audit(log_dirs=[native.parent]).rows[0]
    assert row.fallback is False and row.effective_kernel == "CutlassFP8ScaledMMLinearKernel"
    # a native kernel line does not outweigh the GPU: on SM86 there is no CUTLASS FP8 (rule fp8-w8a8-needs-sm89)
    assert audit(log_dirs=[native.parent], gpu="RTX 3090").rows[0].fallback is True


def test_the_gate_reads_the_logs_own_compute_capability() -> None:
    rep = parse_log_file(CUT)
    rep.extra["compute_capability"] = "8.0"  # as vLLM's dtype-fallback line or llama.cpp's device line give it
    g = report_gate(rep)
    assert g is not None and g.state == "yes" and g.rule == "vllm-fp8-marlin-fallback"
    rep.extra["compute_capability"] = "9.0"
    assert report_gate(rep) is None
    assert parse_cc("8.6") == 86 and parse_cc("86") == 86 and parse_cc(90) == 90 and parse_cc("n/a") is None
    # engines without FP8 gates, and bf16 weights, get nothing from it
    assert fallback_gate("llamacpp", quantization="Q8_0", cc=86) is None
    assert fallback_gate("vllm", quantization=None, weights="bf16", cc=86) is None
    assert fallback_gate("sglang", quantization="fp8", cc=86).rule == "sglang-fp8-marlin-auto"  # type: ignore[union-attr]


def _run(cc: str, gpu: str, fallback: str) -> RunRow:
    return RunRow(run_id=f"r-{cc}", experiment_id="1", run_name="fp8", status="FINISHED", start_time=0, end_time=None,
                  params={"hostname": f"n{cc}", "gpu_name": gpu, "compute_capability": cc, "mig": "False",
                          "engine": "vllm", "engine_version": "0.33.0", "quantization": "fp8", "weights": "fp8"},
                  metrics={}, tags={"quantrack.arm": "fp8", "quantrack.fallback": fallback})


def test_a_tracked_run_on_an_ampere_node_is_never_a_clean_fp8_path() -> None:
    report = build_audit([_run("8.6", "NVIDIA GeForce RTX 3090", "no"), _run("9.0", "NVIDIA H200", "no")])
    by = {r.node: r for r in report.rows}
    assert by["n8.6"].fallback is True and by["n8.6"].fallback_kinds == "fp8_marlin"
    assert by["n8.6"].evidence is not None and by["n8.6"].evidence.startswith("r-8.6: rule vllm-fp8-marlin-fallback:")
    assert by["n9.0"].fallback is False
    assert report.exit_code == 4


def test_audit_gpu_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(CUT, tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path), "--gpu", "RTX 3090", "--format", "json"])
    assert exc.value.code == 4
    data = json.loads(capsys.readouterr().out)
    assert data["nodes"][0]["fallback"] is True
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--logs", str(tmp_path), "--gpu", "RTX 3099"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quantrack: error: unknown GPU 'RTX 3099'") and "\n" not in err
    with pytest.raises(SystemExit) as exc:
        main(["audit", "--experiment", "e", "--gpu", "RTX 3090"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == ("quantrack: error: --gpu names the GPU of raw logs: give --logs DIR "
                                                "(tracked runs carry their own GPU)")


def _exit_code(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_preflight_warns_before_renting(capsys: pytest.CaptureFixture[str]) -> None:
    for gpu, engine in (("RTX 3090", "vllm"), ("A100-80GB", "sglang")):
        code = _exit_code(["preflight", "--gpu", gpu, "--engine", engine, "--model", "Llama-3.1-8B", "--arm", "fp8",
                           "--format", "json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["verdict"] == "warn"
        rule = "vllm-fp8-marlin-fallback" if engine == "vllm" else "sglang-fp8-marlin-auto"
        assert f'"rule": "{rule}"' in json.dumps(out, indent=1)
    _exit_code(["preflight", "--gpu", "RTX 3090", "--model", "Llama-3.1-8B", "--arm", "kv-fp8", "--format", "json"])
    assert '"rule": "fp8-kv-no-fp8-attention-below-sm89"' in json.dumps(json.loads(capsys.readouterr().out), indent=1)
    _exit_code(["preflight", "--gpu", "H200", "--model", "Llama-3.1-8B", "--arm", "kv-fp8", "--format", "json"])
    assert "fp8-kv-no-fp8-attention-below-sm89" not in capsys.readouterr().out


def test_logs_parse_says_what_the_gate_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_code(["logs", "parse", str(CUT), "--format", "json"]) == 0
    gate = json.loads(capsys.readouterr().out)[0]["extra"]["fallback_gate"]
    assert gate["state"] == "unknown" and gate["rule"] == "vllm-fp8-marlin-fallback"
    assert _exit_code(["logs", "parse", str(CUT)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fallback_gate"))
    assert "unknown: FP8 weights on a GPU the log does not name (audit --gpu names it)" in row
    # a line already says it fell back: the gate adds nothing
    assert _exit_code(["logs", "parse", str(WITH_LINE), "--format", "json"]) == 0
    assert "fallback_gate" not in json.loads(capsys.readouterr().out)[0]["extra"]


def test_a_run_on_a_gpu_below_sm89_is_logged_with_the_gate_fallback() -> None:
    """The run-time tag agrees with `audit`: an FP8-weights arm whose log shows no fallback line is logged
    fallback = yes (fp8_marlin, the rule as evidence) when the node's NVML compute capability is below 8.9, and
    stays `no` on the H200 (9.0) the log came from."""
    from pathlib import Path

    from quantrack.engines import parse_log_file
    from quantrack.run.outcome import ArmOutcome
    from quantrack.run.record import record_for_arm
    from quantrack.run.schema import Tag
    from quantrack.study import study_from_dict

    log = Path(__file__).resolve().parents[1] / "data" / "logs" / "h200-default" / "vllm-0.25.0-fp8.log"
    rep = parse_log_file(log, "vllm")
    assert not rep.fallbacks
    study = study_from_dict({"name": "gate", "model": {"name": "Llama-3-8B"}, "engine": {"kind": "vllm"},
                             "arms": [{"name": "bf16", "weights": "bf16", "baseline": True},
                                      {"name": "fp8", "weights": "fp8"}]}, source="<study>")
    tags: dict[str, dict[str, str]] = {}
    for cc, gpu in (("9.0", "NVIDIA H200"), ("8.6", "NVIDIA GeForce RTX 3090")):
        out = ArmOutcome(arm=study.arm("fp8"), node={"compute_capability": cc, "gpu_name": gpu}, status="FINISHED")
        out.log_report = rep
        tags[cc] = record_for_arm(study, out, experiment="gate", parent_uuid=None).tags
    assert tags["9.0"][Tag.FALLBACK] == "no"
    assert tags["8.6"][Tag.FALLBACK] == "yes" and tags["8.6"][Tag.FALLBACK_KINDS] == "fp8_marlin"
    assert tags["8.6"][Tag.FALLBACK_EVIDENCE].startswith("rule vllm-fp8-marlin-fallback")
