"""scripts/calibrate_kv.py's CPU-side parts (the calibration itself runs on the GPU node: it ran on a lent H200 on 2026-12-02): calibration
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
    with pytest.raises(cal.BadArgs, match="--samples must be between 1 and 7473"):
        cal.calibration_texts(0)


def test_scheme_and_sglang_file(tmp_path: Path) -> None:
    assert cal.kv_scheme("attn_head") == {"num_bits": 8, "type": "float", "strategy": "attn_head", "dynamic": False,
                                          "symmetric": True}
    with pytest.raises(cal.BadArgs):
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
    with pytest.raises(cal.BadArgs, match="not a positive number"):
        cal.sglang_scales({0: ([0.0], [0.0])}, "qwen2")


def test_bf16_scales_as_llm_compressor_saves_them(tmp_path: Path) -> None:
    """On the H200 the saved k/v scales were bfloat16 (the model's dtype), which numpy cannot read: the script
    failed after saving the checkpoint. They are read without torch now. Values: the first/last layers' real scales."""
    import struct

    want = {0: (0.80078125, 0.5), 1: (0.0260009765625, 0.125)}
    header: dict[str, dict] = {}
    data = b""
    for layer, (k, v) in want.items():
        for kv, x in (("k", k), ("v", v)):
            bits = struct.unpack("<I", struct.pack("<f", x))[0] >> 16  # exact in bf16
            header[f"model.layers.{layer}.self_attn.{kv}_scale"] = {
                "dtype": "BF16", "shape": [], "data_offsets": [len(data), len(data) + 2]}
            data += struct.pack("<H", bits)
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    assert cal.read_layer_scales(tmp_path) == {i: ([k], [v]) for i, (k, v) in want.items()}
