"""The two-GPU H200 studies (TP 2): they load, and every server of every arm is launched with the parallel flags.

The run itself needs an nvidia-h200-x2 node; these checks are what the CPU can establish before renting it.
Flag spellings: vLLM ``--tensor-parallel-size`` and SGLang ``--tp-size`` (engine-facts.md, launch flags)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantrack.engines import get_adapter
from quantrack.engines.lifecycle import launch_spec_for_study
from quantrack.study import load_study

ROOT = Path(__file__).resolve().parents[2]
TP_FLAG = {"vllm": ["--tensor-parallel-size", "2"], "sglang": ["--tp-size", "2"]}


def _has(argv: list[str], pair: list[str]) -> bool:
    return any(argv[i:i + 2] == pair for i in range(len(argv) - 1))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_arm_launches_at_tp2_with_nvlink_multicast_off(engine: str) -> None:
    study = load_study(ROOT / "examples" / "gpu" / f"h200x2-llama3-8b-tp2-{engine}.toml")
    assert study.engine.kind == engine and study.gpu.count == 2
    assert [a.name for a in study.arms] == ["bf16", "fp8", "fp8-kv"]
    adapter = get_adapter(engine)
    for arm in study.arms:
        spec = launch_spec_for_study(study, arm, port=12345)
        argv = adapter.launch_argv(spec)
        assert _has(argv, TP_FLAG[engine]), argv
        assert adapter.launch_env(spec)["NCCL_NVLS_ENABLE"] == "0"
