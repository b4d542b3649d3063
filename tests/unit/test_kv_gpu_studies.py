"""The H200 KV-cache studies (vLLM's ran on 2026-12-02, SGLang's not yet): every arm validates, launches with the flags it stands for, and preflight
names the scale source each arm's KV cache will use -- on a stand-in of the node's checkpoints made here (Qwen2.5-1.5B's
config.json shapes and safetensors headers: the bf16 export without scales, the llm-compressor checkpoint with
per-tensor k/v scales and a compressed-tensors kv_cache_scheme). The model references and the calibrated path are the
node's; the test points them at the stand-ins, everything else is the shipped study file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantrack.engines import get_adapter
from quantrack.engines.lifecycle import launch_spec_for_study
from quantrack.hardware.preflight import request_from_study, run_preflight
from quantrack.study import load_study
from tests.unit.test_kvscales import CT_QC, per_tensor, write_safetensors

ROOT = Path(__file__).resolve().parents[2]
CALIBRATED = "/root/qt-cache/qwen2.5-coder-1.5b.kv-fp8-calibrated"
# Qwen2.5-Coder-1.5B-Instruct's shapes (28 layers, 12 heads, 2 KV heads x 128; issue #25 / the GGUF metadata)
QWEN_CFG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 1536,
            "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
            "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def _ckpt(d: Path, qc: dict | None, scales: bool) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**QWEN_CFG, **({"quantization_config": qc} if qc else {})}))
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [8, 8])}
    if scales:
        tensors.update(per_tensor())
    write_safetensors(d / "model.safetensors", tensors, with_data=False)
    return d


def _study(engine: str, tmp: Path) -> Path:
    export = _ckpt(tmp / "export", None, scales=False)
    calibrated = _ckpt(tmp / "calibrated", CT_QC, scales=True)
    text = (ROOT / "examples" / "gpu" / f"h200-qwen2.5-coder-1.5b-kv-{engine}.toml").read_text()
    # both ran (docs/gpu/h200-qwen2.5-coder-1.5b.md): each header says so
    assert "Run on a lent H200 on 2026-12-02" in text and "NOT RUN YET" not in text
    text = (text.replace('gguf = "qwen2.5-coder-1.5b:Q4_K_M"', f'config = "{export / "config.json"}"')
                .replace('"qwen2.5-coder-1.5b:hf-bf16"', f'"{export}"').replace(CALIBRATED, str(calibrated)))
    p = tmp / f"kv-{engine}.toml"
    p.write_text(text)
    return p


def _has(argv: list[str], pair: list[str]) -> bool:
    return any(argv[i:i + 2] == pair for i in range(len(argv) - 1))


VLLM = {  # arm -> (--kv-cache-dtype, attention backend, scale rule preflight must name)
    "bf16": (None, "FLASH_ATTN", "kv-not-quantized"),
    "kv-fp8": ("fp8", "FLASH_ATTN", "vllm-kv-unscaled-silent"),
    "kv-fp8-per-token-head": ("fp8_per_token_head", "TRITON_ATTN", "vllm-kv-per-token-head"),
    "kv-fp8-e5m2": ("fp8_e5m2", "TRITON_ATTN", "vllm-kv-e5m2-query-quant"),  # refused at start (measured on H200)
    "bf16-triton": (None, "TRITON_ATTN", "kv-not-quantized"),
    "kv-fp8-computed": ("fp8", "FLASH_ATTN", "vllm-kv-calculate-scales"),
    "kv-int8-per-token-head": ("int8_per_token_head", "TRITON_ATTN", "vllm-kv-per-token-head"),
    "kv-fp8-calibrated": ("fp8", "FLASH_ATTN", "vllm-kv-checkpoint-scales"),
}
SGLANG = {
    "bf16": (None, "kv-not-quantized"),
    "kv-fp8": ("fp8_e4m3", "sglang-kv-unscaled-warned"),
    "kv-fp8-e5m2": ("fp8_e5m2", "sglang-kv-e5m2-unscaled"),
    "kv-fp8-calibrated": ("fp8_e4m3", "sglang-kv-qwen2-checkpoint-scales-dropped"),
    # the calibrated scales as SGLang's JSON on the Triton backend with bf16 weights: the server failed while capturing
    # decode graphs (measured on H200), so the rulebook now refuses it before launch
    "kv-fp8-scales-file": ("fp8_e4m3", "sglang-kv-param-path-triton-crash"),
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kv_study_arms_argv_and_scale_plan(engine: str, tmp_path: Path) -> None:
    path = _study(engine, tmp_path)
    study = load_study(path)
    want = VLLM if engine == "vllm" else SGLANG
    assert [a.name for a in study.arms] == list(want) and study.baseline.name == "bf16"
    ev = study.eval
    assert (ev.num_questions, ev.kl_method, ev.kl_tokens) == (1319, "decode-greedy", 2000)
    assert list(ev.kl_arms) == list(want)[1:]
    adapter = get_adapter(engine)
    for arm in study.arms:
        argv = adapter.launch_argv(launch_spec_for_study(study, arm, port=12345))
        kv = want[arm.name][0]
        assert _has(argv, ["--kv-cache-dtype", kv]) if kv else "--kv-cache-dtype" not in argv, (arm.name, argv)
        if engine == "vllm":
            assert _has(argv, ["--attention-backend", want[arm.name][1]]), (arm.name, argv)
            assert ("--calculate-kv-scales" in argv) == (arm.name == "kv-fp8-computed")
            assert _has(argv, ["--kv-cache-memory-bytes", "4294967296"])
        if arm.name.endswith("calibrated"):
            assert str(tmp_path / "calibrated") in argv
    rep = run_preflight(request_from_study(str(path), gpu="H200"))
    rejected = {r.arm: [v.rule_id for v in r.reasons if v.verdict == "reject"] for r in rep.results if r.verdict == "reject"}
    # vLLM 0.25.0 fails at start with fp8_e5m2 on TRITON_ATTN (its query quantizer asserts fp8/fp8_e4m3/nvfp4): the
    # rulebook rejects that arm before launch; every other arm runs
    assert rejected == ({"kv-fp8-e5m2": ["vllm-kv-e5m2-query-quant"]} if engine == "vllm"
                        else {"kv-fp8-scales-file": ["sglang-kv-param-path-triton-crash"]}), rejected
    plans = {r.arm: r.kv_scales for r in rep.results}
    assert {a: (p or {}).get("rule_id") for a, p in plans.items()} == {a: w[-1] for a, w in want.items()}
    caps = {r.arm: (r.capacity or {}).get("engine_tokens") for r in rep.results}
    if engine == "vllm":  # each arm reports its KV tokens; the derived ones: fp8 doubles bf16's at a fixed 4 GiB
        assert caps["kv-fp8"] == 2 * caps["bf16"] == 2 * caps["bf16-triton"]
        assert caps["kv-fp8-e5m2"] == caps["kv-fp8"] > caps["kv-fp8-per-token-head"] > caps["bf16"]

