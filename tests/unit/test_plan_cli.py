"""`quantrack plan` and `quantrack catalog`: output, JSON keys, and one-line exit-2 errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quantrack.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
SEED = ["--params", "8.03e9", "--layers", "32", "--kv-heads", "8", "--head-dim", "128"]


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Call the console entry point (its own error handling), return (exit code, stdout, stderr)."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_seed_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", *SEED, "--vram", "24", "--arm", "bf16", "--arm", "fp8", "--arm", "fp8-kv"], capsys)
    assert code == 0
    assert "derived, not measured" in out and "bare number = GiB" in out and "sizes in GiB" in out
    for figure in ("58,351", "119,615", "239,230", "14.96", "7.48", "7.12", "14.60", "2.05x", "4.10x"):
        assert figure in out


def test_readme_first_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["plan", "--model", "Llama-3-8B", "--gpu", "H100"], capsys)
    assert code == 0 and err == ""
    assert "NVML total 81,559 MiB" in out
    assert [ln.split()[0] for ln in out.splitlines()[3:]] == ["bf16", "fp8", "fp8-kv", "int8", "w4a16"]


def test_json_keys_and_engine_column(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model", "Llama-3-8B", "--gpu", "H200", "--engine", "vllm", "--context-len", "8192",
                        "--arm", "bf16", "--arm", "fp8-kv", "--format", "json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert {"weights_gib", "kv_budget_gib", "kv_bytes_per_token", "token_capacity", "concurrency", "vs_baseline",
            "fits", "engine_tokens", "basis"} <= set(rows[0])
    assert rows[0]["basis"] == "derived" and rows[0]["engine"] == "vllm"
    assert rows[1]["engine_tokens"] > 2 * 900_000 and rows[0]["engine_tokens"] < rows[0]["token_capacity"]


def test_decimal_units_and_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--model", "Qwen2.5-7B", "--vram", "16GB", "--util", "0.90", "--overhead", "1GB",
                        "--arm", "bf16", "--arm", "int8", "--arm", "w4a16", "--format", "csv"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("arm,weights_format,kv_dtype,weights_gib,weights_gb")
    assert lines[1].split(",")[12] == "False"  # column 12 = fits: bf16 does not fit
    code, out, _ = run(["plan", "--model", "Qwen2.5-7B", "--vram", "16GB", "--util", "0.90", "--overhead", "1GB",
                        "--arm", "bf16", "--arm", "int8"], capsys)
    assert "DOES NOT FIT" in out and "sizes in GB (decimal" in out and "24.63" in out


def test_config_source(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--config", str(CONFIGS / "qwen2.5-7b.json"), "--vram", "24", "--arm", "bf16"], capsys)
    assert code == 0 and "params estimated from shapes" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "Llama-3-8B", "--gpu", "H20"],
     "unknown GPU 'H20' (did you mean 'H200'?); see `quantrack catalog gpus`"),
    (["--model", "Lama-3-8B", "--vram", "24"],
     "unknown model 'Lama-3-8B' (did you mean 'Llama-3-8B'?); see `quantrack catalog models`"),
    (["--config", str(CONFIGS / "incomplete.json"), "--vram", "24"],
     f"{CONFIGS / 'incomplete.json'}: incomplete config, missing num_hidden_layers"),
    (["--config", str(CONFIGS / "deepseek-v2-lite.json"), "--vram", "24"],
     (f"{CONFIGS / 'deepseek-v2-lite.json'}: not modelled from config.json alone: mixture-of-experts "
     "(n_routed_experts=64); its parameter bytes come from the checkpoint's safetensors headers: use --model ORG/NAME")),
    (["--model", "Llama-3-8B", "--vram", "0"], "--vram must be greater than zero, got '0'"),
    (["--model", "Llama-3-8B", "--vram", "-8GiB"],
     "bad --vram '-8GiB': expected a number with an optional unit (24, 24GiB, 16GB, 512MiB)"),
    (["--model", "Llama-3-8B", "--vram", "80G"], "ambiguous --vram '80G': write GiB (binary) or GB (decimal)"),
    ([*SEED[:1], "0", *SEED[2:], "--vram", "24"], "--params must be greater than zero, got '0'"),
    (["--params", "8e9", "--layers", "-2", "--kv-heads", "8", "--head-dim", "128", "--vram", "24"],
     "--layers must be greater than zero, got '-2'"),
    (["--params", "8e9", "--vram", "24"], "--params needs --layers, --kv-heads, --head-dim"),
    (["--model", "Llama-3-8B", "--vram", "24", "--util", "0"], "--util: expected a finite number in (0, 1], got 0"),
    (["--model", "Llama-3-8B", "--vram", "24", "--util", "1.5"], "--util: expected a finite number in (0, 1], got 1.5"),
    (["--model", "Llama-3-8B", "--vram", "24", "--tp", "0"], "--tp: expected an integer in 1..72 (the GPUs of one NVLink domain, GB200 NVL72), got 0"),
    (["--model", "Llama-3-8B", "--vram", "24", "--gpu", "H100"], "give --vram or --gpu, not both"),
    (["--model", "Llama-3-8B", *SEED, "--vram", "24"], "give one model source, not --model and --params ..."),
    (["--model", "Llama-3-8B"], "no memory: give --vram (24, 24GiB, 16GB) or --gpu NAME"),
    (["--vram", "24"], "no model: give --model NAME, --config FILE, --gguf FILE or --params/--layers/--kv-heads/--head-dim"),
    (["--model", "Llama-3-8B", "--gpu", "x86-cpu"],
     "--gpu x86-cpu has no fixed memory; give --vram with the RAM to use instead"),
    (["--model", "Llama-3-8B", "--vram", "24", "--arm", "fp9"],
     ("unknown arm 'fp9' (did you mean 'fp8'?); presets: bf16, fp16, fp8, fp8-kv, kv-fp8, int8, w4a16, awq, gptq "
     "(or weights=…,kv=…)")),
])
def test_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(["plan", *args], capsys)
    assert code == 2 and out == ""
    assert err == f"quantrack: error: {message}\n"


def test_plan_types_its_numbers_as_preflight_does() -> None:
    """--tp, --util and --context-len come from the study schema's settings, with their ranges (issue #31)."""
    from click.testing import CliRunner

    from quantrack.cli.plan import plan

    text = CliRunner().invoke(plan, ["--help"], terminal_width=200).output
    assert "--tp INTEGER" in text and "[integer ≥ 1]" in text
    assert "--util FLOAT" in text and "[number in (0, 1]]" in text
    assert "--context-len INTEGER" in text


def test_malformed_config_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", "--config", str(CONFIGS / "truncated.json"), "--vram", "24"], capsys)
    assert code == 2 and err.count("\n") == 1 and "not valid JSON" in err


def test_catalog_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["catalog", "gpus", "--format", "json"], capsys)
    assert code == 0 and any(g["name"] == "H200" and g["nvml_total_mib"] == 143771 for g in json.loads(out))
    code, out, _ = run(["catalog", "models"], capsys)
    assert code == 0 and "SmolLM2-135M" in out and "134,515,008" in out


def test_subprocess_entry_point() -> None:
    ok = subprocess.run([sys.executable, "-m", "quantrack.cli", "plan", *SEED, "--vram", "24", "--arm", "fp8-kv"],
                        capture_output=True, text=True, timeout=600, check=False)
    bad = subprocess.run([sys.executable, "-m", "quantrack.cli", "plan", "--model", "Llama-3-8B", "--gpu", "H20"],
                         capture_output=True, text=True, timeout=600, check=False)
    if ok.returncode != 0 and "No module named quantrack.cli.__main__" in ok.stderr:
        pytest.skip("quantrack.cli has no __main__")
    assert ok.returncode == 0 and "239,230" in ok.stdout
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "did you mean 'H200'" in bad.stderr


# --- vLLM's profile settings (--max-num-batched-tokens / --max-num-seqs) -------------------------------------

PUBLIC_LOGS = Path(__file__).resolve().parents[1] / "data" / "public-logs"
# docs/capacity-model.md §4.1: the #10517 RTX 3090 run, as its excerpt's header and profiling line state it
RTX3090_29K = ["plan", "--model", "Llama-3.1-8B", "--vram", "23.58GiB", "--util", "0.90", "--context-len", "29000",
               "--arm", "bf16", "--engine", "vllm", "--format", "json"]


def test_plan_vllm_profile_settings_match_the_public_v0_log(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.engines import parse_log_file

    logged = parse_log_file(PUBLIC_LOGS / "vllm-10517-rtx3090-llama31-8b-29k.log", "vllm").kv_cache_tokens
    assert logged == 1478 * 16  # '# GPU blocks: 1478'
    code, out, err = run([*RTX3090_29K, "--max-num-batched-tokens", "29000", "--max-num-seqs", "256"], capsys)
    assert code == 0 and err == ""
    (row,) = json.loads(out)
    assert row["token_capacity"] == 51318  # the naive column does not depend on the profile settings
    assert round(100 * (row["engine_tokens"] - logged) / logged, 1) == -3.9  # the doc's engine-aware error
    # without them the column assumes V1's chunked-prefill default (2,048 batched tokens): far more KV
    code, out, _ = run(RTX3090_29K, capsys)
    (default_row,) = json.loads(out)
    assert default_row["engine_tokens"] == 43792 and default_row["token_capacity"] == 51318
    # the table says which settings the engine-aware column used
    code, out, _ = run([*RTX3090_29K[:-2], "--max-num-batched-tokens", "29000"], capsys)
    assert code == 0
    assert "vLLM profile: max_num_batched_tokens 29000, max_num_seqs default (vLLM V1, by GPU memory)" in out


@pytest.mark.parametrize(("extra", "message"), [
    (["--max-num-seqs", "256"], ("--max-num-seqs: vLLM's profile settings, used by the engine-aware column; "
                                 "add --engine vllm")),
    (["--engine", "sglang", "--max-num-batched-tokens", "8192"], "--max-num-batched-tokens: vLLM's profile settings"),
    (["--engine", "vllm", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be greater than zero"),
    (["--engine", "vllm", "--max-num-seqs", "many"], "--max-num-seqs must be an integer, got 'many'"),
])
def test_plan_profile_settings_bad_input(capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    code, out, err = run(["plan", "--model", "Llama-3.1-8B", "--vram", "24", *extra], capsys)
    assert code == 2 and out == ""
    assert err.startswith(f"quantrack: error: {message}") and err.count("\n") == 1


def test_plan_and_preflight_help_type_their_numbers():
    """#31: `plan` typed every number as TEXT while `preflight` had ranges; numbers now read INTEGER/COUNT/MEMORY."""
    import re

    from click.testing import CliRunner

    from quantrack.cli import cli as group

    for cmd in ("plan", "preflight"):
        out = CliRunner().invoke(group, [cmd, "--help"], terminal_width=200).output
        for flag in ("--layers", "--kv-heads", "--head-dim", "--params", "--kv-cache-memory-bytes"):
            line = next(l for l in out.splitlines() if re.match(rf"\s+{flag}\b", l))
            assert " TEXT" not in line, (cmd, line)
        assert "[integer ≥ 1]" in out
    out = CliRunner().invoke(group, ["plan", "--help"], terminal_width=200).output
    for flag in ("--vram", "--overhead", "--max-num-seqs", "--hidden-size"):
        line = next(l for l in out.splitlines() if re.match(rf"\s+{flag}\b", l))
        assert " TEXT" not in line, line
