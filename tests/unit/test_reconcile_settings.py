"""`quantrack logs reconcile` with vLLM's profile settings and the device total the log reports.

The log is the verbatim public excerpt tests/data/public-logs/vllm-10517-rtx3090-llama31-8b-29k.log (vLLM V0,
RTX 3090, Llama-3.1-8B bf16). Its header states --max-model-len 29000 and util 0.90 (also in its profiling line);
V0 profiles without chunked prefill below 32K, i.e. at max_num_batched_tokens = max_model_len, and its default
max_num_seqs is 256. docs/capacity-model.md §4.1 documents the engine-aware error for it: -3.9 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.cli import main

LOGS = Path(__file__).resolve().parents[1] / "data" / "public-logs"
LOG = LOGS / "vllm-10517-rtx3090-llama31-8b-29k.log"
THREAD = ["--max-num-batched-tokens", "29000", "--max-num-seqs", "256"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    # the excerpt has no banner, so the arm is not in the log: the thread states bf16 (no quantization). The run failed
    # its max-model-len check after sizing the cache: reconcile compares that cache only when asked to
    sized = ["--sized-before-failure"] if args and args[0] == str(LOG) else []
    try:
        main(["logs", "reconcile", *args, *sized, *([] if "--arm" in args else ["--arm", "bf16"])])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def rows(data: dict) -> dict[str, dict]:
    return {r["figure"]: r for r in data["rows"]}


def test_thread_settings_reproduce_the_documented_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, str(LOG), "--model", "Llama-3.1-8B", "--gpu", "RTX 3090", *THREAD,
                         "--format", "json")
    assert code == 0 and err == ""
    data = json.loads(out)
    tokens = rows(data)["kv_cache_tokens"]
    assert tokens["log"] == 23648  # '# GPU blocks: 1478' x 16
    assert tokens["predicted"] == 22736
    assert round(tokens["error_pct"], 1) == -3.9  # docs/capacity-model.md §4.1
    assert rows(data)["available_kv_gib"]["predicted"] == 2.7765  # doc: "KV 2.777 vs 2.89 GiB" (4 decimals here)
    # the device total the engine logged (total_gpu_memory=23.58GiB), not the catalog's 24.0 GiB RTX 3090
    assert data["memory_gib"] == 23.58 and data["gpu"] == "RTX 3090"
    assert "total the log reports" in data["memory_basis"] and "24.00 GiB for RTX 3090" in data["memory_basis"]
    assert data["settings"] == {"max_num_batched_tokens": 29000, "max_num_seqs": 256}
    assert (data["util"], data["context_len"]) == (0.9, 29000)  # both read from the log


def test_table_says_where_the_memory_and_settings_came_from(capsys: pytest.CaptureFixture[str]) -> None:
    # no --gpu: the log's own total is enough for a vLLM V0 log
    code, out, err = run(capsys, str(LOG), "--model", "Llama-3.1-8B", *THREAD)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "device memory: 23.58 GiB: the device total the log reports (total_gpu_memory), what the engine " \
           "sized from" in lines
    assert "vLLM profile settings: max_num_batched_tokens 29000, max_num_seqs 256" in lines
    assert next(ln for ln in lines if ln.startswith("kv_cache_tokens")).split()[-1] == "-3.86"


def test_vram_wins_over_the_logged_total_and_defaults_are_said(capsys: pytest.CaptureFixture[str]) -> None:
    # docs §4.1: with the catalog's 24.0 GiB and V1's defaults, reconcile says 46,896 (+98.3 %)
    code, out, _ = run(capsys, str(LOG), "--model", "Llama-3.1-8B", "--vram", "24", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert rows(data)["kv_cache_tokens"]["predicted"] == 46896
    assert round(rows(data)["kv_cache_tokens"]["error_pct"], 1) == 98.3
    assert data["memory_basis"] == "24.00 GiB (--vram 24)" and data["memory_gib"] == 24.0
    assert data["settings"] == {"max_num_batched_tokens": 2048, "max_num_seqs": 256}  # V1 defaults, < 70 GiB
    code, out, _ = run(capsys, str(LOG), "--model", "Llama-3.1-8B", "--vram", "24")
    assert "(vLLM V1 defaults for this GPU: give --max-num-batched-tokens / --max-num-seqs" in out


@pytest.mark.parametrize(("args", "message"), [
    (["sglang-21348-4xh100-qwen3-235b-fp8.log", "--gpu", "H100", "--max-num-seqs", "256"],
     "quantrack: error: --max-num-batched-tokens / --max-num-seqs are vLLM's profile settings; this is a sglang log"),
    (["vllm-lmcache1739-qwen3-14b.log"],  # V1 log without a device total: --gpu still needed
     "quantrack: error: --gpu is required for a GPU engine's log (e.g. --gpu H200)"),
    ([LOG.name, "--vram", "80G"], "quantrack: error: ambiguous --vram '80G'"),
])
def test_bad_input_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = run(capsys, str(LOGS / args[0]), "--model", "Llama-3.1-8B", *args[1:])
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1
