"""`quantrack preflight` end to end in-process: exit codes 0/3/2, --strict, bad input, study files."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from quantrack.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:  # the console script does sys.exit(main()): click returns ctx.exit codes, errors raise SystemExit
        code = main(["preflight", *args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def run_json(capsys, *args: str) -> tuple[int, dict]:
    code, out, err = run(capsys, *args, "--format", "json")
    assert err == ""
    return code, json.loads(out)


def result(data: dict, arm: str) -> dict:
    return next(r for r in data["results"] if r["arm"] == arm)


def test_nothing_rejected_exits_0(capsys):
    code, data = run_json(capsys, "--gpu", "H100", "--arm", "bf16")
    assert code == 0 and data["verdict"] == "allow" and data["exit_code"] == 0


def test_fp8_on_a100_vllm_warns_marlin_exit_0(capsys):
    code, out, _ = run(capsys, "--gpu", "A100", "--arm", "bf16", "--arm", "fp8")
    assert code == 0
    assert "vllm-fp8-marlin-fallback" in out
    assert "expect in the log: Selected MarlinFP8ScaledMMLinearKernel for Fp8LinearMethod" in out


def test_strict_makes_warning_exit_3(capsys):
    assert run(capsys, "--gpu", "A100", "--arm", "fp8", "--strict")[0] == 3


def test_fp8_rejected_on_t4_for_sglang_exit_3(capsys):
    code, data = run_json(capsys, "--gpu", "T4", "--arm", "fp8", "--engine", "sglang")
    assert code == 3
    r = result(data, "fp8")
    assert r["verdict"] == "reject" and r["launch"] is None
    assert "method-min-capability" in [x["rule"] for x in r["reasons"] if x["verdict"] == "reject"]


def test_fp8_allowed_on_h100_cuda_12_4(capsys):
    code, data = run_json(capsys, "--gpu", "H100", "--arm", "fp8", "--cuda", "12.4", "--engine-version", "0.25.0",
                          "--strict")
    assert code == 0
    r = result(data, "fp8")
    assert r["verdict"] == "allow"
    assert [x["rule"] for x in r["reasons"]] == ["cutlass-fp8-sm90-ok"]
    assert r["engine_flags"] == {"--quantization": "fp8"}


def test_fp8_rejected_on_l4_cuda_12_1(capsys):
    code, data = run_json(capsys, "--gpu", "L4", "--arm", "fp8", "--cuda", "12.1")
    assert code == 3
    assert "cutlass-fp8-sm89-needs-cuda12.4" in [x["rule"] for x in result(data, "fp8")["reasons"]]


def test_capacity_and_launch_for_runnable_arms(capsys):
    code, data = run_json(capsys, "--gpu", "H100", "--arm", "bf16", "--arm", "fp8", "--model", "Llama-3-8B",
                          "--context-len", "4096", "--cuda", "12.4")
    assert code == 0
    for arm in ("bf16", "fp8"):
        r = result(data, arm)
        cap = r["capacity"]
        assert cap["basis"] == "derived" and cap["naive_tokens"] > 0 and cap["engine_tokens"] > 0
    fp8, bf16 = result(data, "fp8"), result(data, "bf16")
    assert fp8["capacity"]["naive_tokens"] > bf16["capacity"]["naive_tokens"]  # FP8 weights leave more for KV
    if fp8["launch"] is not None:  # engine adapters present
        assert "--quantization" in fp8["launch"] and "fp8" in fp8["launch"]
        assert fp8["launch_display"].startswith(fp8["launch"][0])
    else:
        assert fp8["launch_note"]


def test_rejected_arm_gets_no_launch_command(capsys):
    _, data = run_json(capsys, "--gpu", "T4", "--arm", "fp8", "--engine", "sglang", "--model", "Llama-3-8B")
    r = result(data, "fp8")
    assert r["launch"] is None and r["launch_note"] == "not runnable: no launch command"


@pytest.mark.parametrize("args, message", [
    (["--gpu", "H10", "--arm", "fp8"], "quantrack: error: unknown GPU 'H10' (did you mean 'H100-SXM'?); see `quantrack catalog gpus`"),
    (["--gpu", "H100", "--arm", "fp8", "--engine", "vlm"], "quantrack: error: unknown engine 'vlm' (did you mean 'vllm'?)"),
    (["--gpu", "H100", "--arm", "fp9"], "quantrack: error: unknown arm 'fp9' (did you mean 'fp8'?)"),
    (["--gpu", "H100", "--arm", "fp8", "--study", "s.toml"], "quantrack: error: give --arm or --study, not both (a study file lists its own [[arms]])"),
    (["--gpu", "H100", "--arm", "fp8", "--model", "Llama-3-8B", "--config", "c.json"], "quantrack: error: give one model source, not --model and --config"),
    (["--gpu", "H100"], "quantrack: error: no arms: give --arm (repeatable, e.g. --arm bf16 --arm fp8) or --study FILE"),
    (["--gpu", "H100", "--arm", "fp8", "--cuda", "twelve"], "quantrack: error: bad --cuda 'twelve': expected digits like 12.4 or 0.33.0"),
    (["--gpu", "auto", "--arm", "fp8"], "quantrack: error: no NVIDIA driver found (NVML could not be loaded); use --gpu NAME to check a GPU from the catalog"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, message):
    if args[1] == "auto":
        from quantrack.errors import EnvironmentMissing
        from quantrack.nvml import read_gpus

        with contextlib.suppress(EnvironmentMissing):
            read_gpus()
            pytest.skip("an NVIDIA driver is present here")
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_unknown_method_for_engine_rejects_with_did_you_mean(capsys):
    code, data = run_json(capsys, "--gpu", "H100", "--arm", "weights=w4a16,quantization=gptq_marlinn")
    assert code == 3
    reason = next(x for x in data["results"][0]["reasons"] if x["rule"] == "method-name")
    assert "(did you mean 'gptq_marlin'?)" in reason["message"]


def test_unreadable_study_file_exit_2(capsys, tmp_path):
    missing = tmp_path / "nope.toml"
    code, _, err = run(capsys, "--study", str(missing))
    assert code == 2 and err == f"quantrack: error: cannot read study file '{missing}': No such file or directory\n"
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [", encoding="utf-8")
    code, _, err = run(capsys, "--study", str(bad))
    assert code == 2 and err.startswith(f"quantrack: error: study file '{bad}' is not valid TOML:")


STUDY = '''
name = "t4-sglang"
[model]
name = "Llama-3-8B"
[engine]
kind = "sglang"
[gpu]
name = "T4"
[eval]
task = "gsm8k"
num_questions = 200
[[arms]]
name = "bf16"
weights = "bf16"
[[arms]]
name = "fp8-kv"
weights = "fp8"
kv = "fp8"
quantization = "fp8"
'''


def test_study_file_drives_preflight(capsys, tmp_path):
    path = tmp_path / "study.toml"
    path.write_text(STUDY, encoding="utf-8")
    code, data = run_json(capsys, "--study", str(path))
    assert code == 3 and data["engine"] == "sglang"
    assert result(data, "fp8-kv")["verdict"] == "reject"
    rules = {x["rule"] for x in result(data, "fp8-kv")["reasons"]}
    assert {"method-min-capability", "fp8-weights-kv-conflated"} <= rules
    assert [v["rule"] for v in data["study"]] == ["accuracy-sample-too-small"]
    # flags override the file: the same study on an H100
    code, data = run_json(capsys, "--study", str(path), "--gpu", "H100")
    assert result(data, "fp8-kv")["verdict"] == "warn"


def test_example_study_runs(capsys):
    example = Path(__file__).resolve().parents[2] / "examples" / "h100-llama3-8b.toml"
    code, data = run_json(capsys, "--study", str(example))
    assert code == 0 and data["engine"] == "vllm"
    assert {r["arm"] for r in data["results"]} == {"bf16", "fp8", "fp8-kv", "kv-fp8"}
    assert all(r["verdict"] != "reject" for r in data["results"])
