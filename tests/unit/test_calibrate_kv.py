"""scripts/calibrate_kv.py's CPU-side parts (the calibration itself runs on the GPU node: NOT RUN YET): calibration
text comes from GSM8K's train split only, the KV scheme is one vLLM accepts, and the SGLang scales file is built from
the saved scale tensors in SGLang's QuantParamSchema layout."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("calibrate_kv", ROOT / "scripts" / "calibrate_kv.py")
assert spec and spec.loader
cal = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cal)


def test_calibration_text_is_train_only() -> None:
    from quantrack.accuracy.gsm8k import load_data

    texts = cal.calibration_texts(8)
    assert [t["source"] for t in texts] == [f"gsm8k/train.jsonl:{i}" for i in range(1, 9)]
    data = load_data(num_shots=0)
    test_q = {r["question"].strip() for r in data.test}
    for t, row in zip(texts, data.train[:8], strict=True):
        assert t["text"].startswith(f"Question: {row['question'].strip()}\nAnswer: ")
        assert row["question"].strip() not in test_q
    with pytest.raises(SystemExit, match="--samples must be between 1 and 7473"):
        cal.calibration_texts(0)


def test_scheme_and_sglang_file(tmp_path: Path) -> None:
    assert cal.kv_scheme("attn_head") == {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False,
                                          "symmetric": True}
    with pytest.raises(SystemExit):
        cal.kv_scheme("channel")
    save_file({"model.layers.0.self_attn.k_scale": np.array(0.5, dtype=np.float32),
               "model.layers.0.self_attn.v_scale": np.array(0.25, dtype=np.float32),
               "model.layers.1.self_attn.k_scale": np.array([0.1, 0.7], dtype=np.float32),  # attn_head: 2 KV heads
               "model.layers.1.self_attn.v_scale": np.array([0.2, 0.3], dtype=np.float32),
               "model.layers.0.self_attn.k_proj.weight": np.zeros((2, 2), dtype=np.float32)},
              str(tmp_path / "model.safetensors"))
    scales = cal.read_layer_scales(tmp_path)
    doc = json.loads(json.dumps(cal.sglang_scales(scales, "qwen2")))
    assert doc["model_type"] == "qwen2" and doc["kv_cache"]["dtype"] == "float8_e4m3fn"
    got = {k: round(v, 6) for k, v in doc["kv_cache"]["scaling_factor"]["0"].items()}
    assert got == {"0": 0.5, "1": 0.7}
    with pytest.raises(SystemExit, match="not a positive number"):
        cal.sglang_scales({0: ([0.0], [0.0])}, "qwen2")
