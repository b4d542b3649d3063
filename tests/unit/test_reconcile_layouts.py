"""`quantrack logs reconcile` on real deployments: tensor parallelism read from the log (or --tp, which must agree),
per-rank and total figures, llama.cpp slots, the arm only from lines that name the weights' format, and a one-line
refusal for layouts the capacity model does not cover. Logs: the public excerpts in tests/data/public-logs/ (their
sidecars give the thread and its settings) and the real logs in tests/data/logs/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.engines import parse_log_file
from quantrack.engines.reconcile import establish_arm, parallel_from_report

DATA = Path(__file__).resolve().parents[1] / "data"
PUB = DATA / "public-logs"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(["logs", "reconcile", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def rows(data: dict) -> dict[tuple[str, str], dict]:
    return {(r["figure"], r["scope"].split(" ")[0]): r for r in data["rows"]}


def test_tp2_log_predicts_per_rank_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    """PR 10511's `vllm serve meta-llama/Meta-Llama-3-8B -tp 2`: TP 2 is read from the command line in the log."""
    log = PUB / "vllm-10511-v0-profile-table-tp2.log"
    layout = parallel_from_report(parse_log_file(log))
    assert layout["tp"] == {"size": 2, "source": "the vllm serve command line in the log"}
    code, out, err = run(capsys, str(log), "--model", "Llama-3.1-8B", "--arm", "bf16", "--format", "json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["parallel"] == {"tp": 2, "pp": 1, "dp": 1}
    r = rows(data)
    per, total = r[("weights_gib", "per")], r[("weights_gib", "total")]
    assert per["log"] == 7.48 and total["log"] == 14.96  # 7.48 GiB per rank, x 2 (derived from the log)
    assert total["predicted"] == round(per["predicted"] * 2, 4)
    assert abs(per["error_pct"]) < 0.5
    assert data["memory_gib"] == 79.22  # the device total this log prints
    # without the log's TP the per-rank weights would be off by 2x: a --tp that disagrees is refused
    code, _, err = run(capsys, str(log), "--model", "Llama-3.1-8B", "--arm", "bf16", "--tp", "1")
    assert code == 2 and err == ("quantrack: error: --tp 1, but the log says tp 2 (the vllm serve command line in "
                                 "the log)\n")


def test_tp4_sglang_log_per_rank_and_total(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM #21348's SGLang line (`--tp 4 --mem-fraction-static 0.93`, Qwen3-235B-A22B-FP8 on 4 x H100): the excerpt
    has no rank prefix, so --tp 4 comes from the thread; shapes from the model's config.json (sidecar)."""
    log = PUB / "sglang-21348-4xh100-qwen3-235b-fp8.log"
    args = [str(log), "--params", "235e9", "--layers", "94", "--kv-heads", "4", "--head-dim", "128", "--arm", "fp8",
            "--gpu", "H100", "--tp", "4", "--util", "0.93", "--context-len", "40960", "--format", "json"]
    code, out, err = run(capsys, *args)
    assert code == 0 and err == ""
    data = json.loads(out)
    r = rows(data)
    assert data["parallel"] == {"tp": 4, "pp": 1, "dp": 1} and data["parallel_basis"]["tp"] == "--tp"
    assert r[("kv_cache_tokens", "per")]["log"] == 367404  # one pool of tokens, each rank holds 1 of 4 KV heads
    per, total = r[("available_kv_gib", "per")], r[("available_kv_gib", "total")]
    assert per["log"] == 16.46 and total["log"] == 65.84
    assert total["predicted"] == round(per["predicted"] * 4, 4)
    assert per["error_pct"] == total["error_pct"]
    assert 5 < r[("kv_cache_tokens", "per")]["error_pct"] < 15  # +10.1 %: docs/capacity-model.md, log parsing


def test_two_slot_llamacpp_log(capsys: pytest.CaptureFixture[str]) -> None:
    """The real xllamacpp log with -np 2: the prediction covers both slots (before: as if 1 slot, -50 %)."""
    log = DATA / "logs" / "xllamacpp-SmolLM2-Q4_0-np2-kvq8_0.log"
    code, out, err = run(capsys, str(log), "--model", "SmolLM2-135M", "--format", "json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["parallel"] == {"slots": 2} and data["parallel_basis"]["slots"] == "the log's slot count"
    assert data["arm"]["weights"] == "q4_0" and data["arm"]["kv"] == "q8_0"  # GGUF file type + K/V cache types
    r = rows(data)
    assert r[("kv_cache_tokens", "all")]["log"] == 1024 and r[("kv_cache_tokens", "all")]["error_pct"] == 0.0
    assert r[("kv_mib", "all")]["error_pct"] == 0.0
    # the old reading: the per-slot context (n_ctx_seq 512) as if it were the only slot
    code, out, _ = run(capsys, str(log), "--model", "SmolLM2-135M", "--slots", "1", "--context-len", "512",
                       "--format", "json")
    assert code == 0 and rows(json.loads(out))[("kv_cache_tokens", "all")]["error_pct"] == -50.0


def test_sglang_activation_dtype_is_not_the_weights() -> None:
    """SGLang's load line prints the activation dtype (torch.bfloat16 for an FP8 checkpoint too), and its
    quantization=None describes a pre-quantized checkpoint as well: neither establishes bf16 weights."""
    old = parse_log_file(PUB / "sglang-4895-4090-gemma3-load-weight.log")
    assert old.dtype == "bf16" and old.extra["activation_dtype"] == "bf16"
    assert establish_arm(old) == (None, "the log names no quantization (no server_args line with quantization=)")
    real = parse_log_file(DATA / "logs" / "h200-util045" / "sglang-0.5.16-bf16.log")
    arm, why = establish_arm(real)
    assert arm is None and why.startswith("SGLang's quantization=None is printed for a pre-quantized checkpoint too")
    fp8 = parse_log_file(DATA / "logs" / "h200-util045" / "sglang-0.5.16-fp8kv.log")
    arm, _ = establish_arm(fp8)
    assert arm is not None and (arm.weights, arm.kv) == ("fp8", "fp8_e4m3")  # --quantization fp8, pool fp8_e4m3


@pytest.mark.parametrize(("log", "args", "message"), [
    ("sglang-4895-4090-gemma3-load-weight.log", ["--model", "Llama-3.1-8B", "--gpu", "RTX 4090"],
     "arm unknown: the log names no quantization (no server_args line with quantization=); pass --arm"),
    ("vllm-10517-rtx3090-llama31-8b-29k.log", ["--model", "Llama-3.1-8B", "--sized-before-failure"],
     "arm unknown: the log names no quantization (no engine banner with quantization=); pass --arm"),
    ("sglang-ktransformers1870-tp2-hybrid-gdn.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "RTX 4090"],
     ("cannot reconcile sglang-ktransformers1870-tp2-hybrid-gdn.log: the log shows a Mamba/linear-attention state "
     "cache, which the capacity model does not cover")),
    ("iklcpp-237-mla-context.log", ["--model", "Llama-3.1-8B", "--arm", "weights=q4_0,kv=auto"],
     ("cannot reconcile iklcpp-237-mla-context.log: the log shows an MLA cache (latent KV), which the capacity model "
     "does not cover")),
    ("vllm-32105-pp-kv-too-small.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--gpu", "H100",
                                         "--sized-before-failure"],
     ("pipeline parallelism (pp 7: PP ranks in the log's process prefixes (highest rank + 1: at least 7)) is not "
     "modelled: the layer split per stage is not in the capacity model")),
    ("vllm-club3090-430-tp2-fp8-marlin-lmcache.log", ["--model", "Llama-3.1-8B", "--arm", "fp8", "--tp", "1"],
     ("--tp 1, but the log shows ranks up to 1 (TP ranks in the log's process prefixes (highest rank + 1: at least "
     "2))")),
    ("sglang-29575-max-total-tokens.log", ["--model", "Llama-3.1-8B", "--arm", "bf16", "--slots", "2"],
     "--slots is llama.cpp's -np; this is a sglang log"),
])
def test_refusals_are_one_line(capsys: pytest.CaptureFixture[str], log: str, args: list[str], message: str) -> None:
    code, out, err = run(capsys, str(PUB / log), *args)
    assert (code, out, err) == (2, "", f"quantrack: error: {message}\n")


def test_model_from_shapes_or_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = PUB / "vllm-10511-v0-profile-table-tp1.log"
    code, out, _ = run(capsys, str(log), "--params", "8.03e9", "--layers", "32", "--kv-heads", "8", "--head-dim",
                       "128", "--arm", "bf16", "--format", "json")
    assert code == 0 and json.loads(out)["model"] == "custom"
    code, _, err = run(capsys, str(log), "--model", "Llama-3.1-8B", "--params", "8e9", "--arm", "bf16")
    assert code == 2 and err == "quantrack: error: give one model source, not --model and --params ...\n"
    code, _, err = run(capsys, str(log), "--arm", "bf16")
    assert code == 2 and err.startswith("quantrack: error: no model: give --model NAME, --config FILE")
