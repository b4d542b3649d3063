#!/usr/bin/env python3
"""Calibrate FP8 KV-cache scales with llm-compressor on GSM8K's TRAIN split, and write them two ways.

Run on a lent H200 on 2026-12-02 (~80 s for Qwen2.5-Coder-1.5B; docs/gpu/h200-qwen2.5-coder-1.5b.md). On the node,
after the bf16 export:

    pip install -e '.[calibrate]'            # llmcompressor==0.14.0.1 (torch, transformers come with it)
    # (on the H200 image: llmcompressor, compressed-tensors, auto-round, datasets, loguru, dill, multiprocess
    #  installed with --no-deps beside the image's torch 2.11 -- llmcompressor's resolver asks for another torch)
    python scripts/calibrate_kv.py --model /root/qt-cache/<qwen2.5-coder-1.5b export dir> \\
        --out /root/qt-cache/qwen2.5-coder-1.5b.kv-fp8-calibrated [--strategy tensor|attn_head] [--samples 512]

Output directory:
- a compressed-tensors checkpoint: the model's bf16 weights unchanged, ``quantization_config.kv_cache_scheme``
  (8-bit float, the strategy given) and per-layer ``self_attn.k_scale`` / ``self_attn.v_scale`` tensors -- what vLLM
  loads (rules/kv-scales.toml: vllm-kv-checkpoint-scales) and what ``quantrack preflight`` reads from the headers;
- ``sglang-kv-scales.json``: the same scales in SGLang's ``--quantization-param-path`` format (QuantParamSchema:
  one scale per layer for K and V alike, so max(k_scale, v_scale); per-head scales are reduced to their max);
- ``calibration.json``: what was done (samples, their source lines in the train split, strategy, versions).

The recipe follows vLLM 0.25.0's own example (docs/features/quantization/quantized_kvcache.md:L124-L206:
``QuantizationModifier(kv_cache_scheme=QuantizationArgs(num_bits=8, type="float", strategy=...))``, ``oneshot``,
``save_pretrained(save_compressed=True)``), with the KV scheme only: weights and queries stay as they are.
Calibration text: the first ``--samples`` questions + reference answers of GSM8K's train split as shipped in
quantrack (hash-checked); the test split is never read, and the script refuses to run if any calibration question
is also a test question.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def calibration_texts(n: int) -> list[dict[str, Any]]:
    """The first ``n`` GSM8K train examples as {"text", "source"}; refuses any overlap with the test split."""
    from quantrack.accuracy.gsm8k import load_data

    data = load_data(num_shots=0)
    if not 1 <= n <= len(data.train):
        raise SystemExit(f"--samples must be between 1 and {len(data.train)} (the train split), got {n}")
    test_questions = {row["question"].strip() for row in data.test}
    out = []
    for i, row in enumerate(data.train[:n]):
        q = row["question"].strip()
        if q in test_questions:
            raise SystemExit(f"train line {i + 1} is also a test question: refusing to calibrate on it")
        out.append({"text": f"Question: {q}\nAnswer: {row['answer'].strip()}", "source": f"gsm8k/train.jsonl:{i + 1}"})
    return out


def kv_scheme(strategy: str) -> dict[str, Any]:
    """The compressed-tensors kv_cache_scheme vLLM accepts: 8-bit float, symmetric, tensor or attn_head
    (vllm@dd10e03f9:vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:L972-L1010)."""
    if strategy not in ("tensor", "attn_head"):
        raise SystemExit(f"--strategy must be tensor or attn_head, got {strategy!r}")
    return {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}


def sglang_scales(layer_scales: dict[int, tuple[list[float], list[float]]], model_type: str) -> dict[str, Any]:
    """SGLang's QuantParamSchema for TP 1 (sglang@v0.5.16 python/sglang/srt/model_loader/weight_utils.py:L1610-L1681):
    one scale per layer, the max over K and V (and over heads for attn_head scales)."""
    factors = {}
    for layer, (k, v) in sorted(layer_scales.items()):
        s = max([*k, *v])
        if not (s > 0 and math.isfinite(s)):
            raise SystemExit(f"layer {layer}: scale {s!r} is not a positive number")
        factors[layer] = s
    return {"model_type": model_type, "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {0: factors}}}


def _bf16_values(path: Path, name: str) -> list[float]:
    """A bfloat16 tensor's values without torch: bf16 is the top half of a float32."""
    import struct

    import numpy as np

    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
        start, end = header[name]["data_offsets"]
        fh.seek(8 + n + start)
        raw = np.frombuffer(fh.read(end - start), dtype="<u2")
    return [float(x) for x in (raw.astype("<u4") << 16).view("<f4")]


def read_layer_scales(ckpt: Path) -> dict[int, tuple[list[float], list[float]]]:
    """The k/v scale tensors of a saved checkpoint (only those tensors are read), per layer index."""
    import re

    from safetensors import safe_open

    pat = re.compile(r"\.layers\.(\d+)\.self_attn\.([kv])_scale$")
    found: dict[int, dict[str, list[float]]] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                m = pat.search(name)
                if not m:
                    continue
                try:
                    values = [float(x) for x in st.get_tensor(name).ravel()]
                except TypeError:  # bfloat16 (the model's dtype, as llm-compressor saves them): numpy has none
                    values = _bf16_values(f, name)
                found.setdefault(int(m.group(1)), {})[m.group(2)] = values
    if not found:
        raise SystemExit(f"{ckpt}: no self_attn.k_scale / v_scale tensors were saved")
    return {i: (d.get("k", []), d.get("v", [])) for i, d in found.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="bf16 Hugging Face checkpoint directory")
    ap.add_argument("--out", required=True, help="output directory (must not exist)")
    ap.add_argument("--strategy", default="tensor", choices=["tensor", "attn_head"])
    ap.add_argument("--samples", type=int, default=512, help="GSM8K train examples (from the first)")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--finish", action="store_true",
                    help="--out holds a checkpoint this script saved but did not finish: write only the SGLang scales "
                         "file and calibration.json from it (same arguments as the first call)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.exists() and not a.finish:
        raise SystemExit(f"--out {out}: exists; give a new directory")
    if a.finish and not (out / "config.json").exists():
        raise SystemExit(f"--finish: {out} holds no saved checkpoint")
    texts = calibration_texts(a.samples)
    scheme = kv_scheme(a.strategy)

    # the [calibrate] extra is imported inside the steps, so --help and the tests need none of it
    if not a.finish:
        _calibrate(a, texts, scheme, out)
    return _write_side_files(a, texts, scheme, out)


def _calibrate(a: argparse.Namespace, texts: list[dict[str, Any]], scheme: dict[str, Any], out: Path) -> None:
    from compressed_tensors.quantization import QuantizationArgs
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype="auto")
    tok = AutoTokenizer.from_pretrained(a.model)
    ds = Dataset.from_list([{"text": t["text"]} for t in texts]).map(
        lambda ex: tok(ex["text"], max_length=a.max_seq_len, truncation=True, add_special_tokens=False),
        remove_columns=["text"])
    recipe = QuantizationModifier(kv_cache_scheme=QuantizationArgs(**scheme))
    oneshot(model=model, dataset=ds, recipe=recipe, max_seq_length=a.max_seq_len, num_calibration_samples=len(texts))
    model.save_pretrained(str(out), save_compressed=True)
    tok.save_pretrained(str(out))


def _write_side_files(a: argparse.Namespace, texts: list[dict[str, Any]], scheme: dict[str, Any], out: Path) -> int:
    import llmcompressor
    import torch
    import transformers

    cfg = json.loads((out / "config.json").read_text())
    scales = read_layer_scales(out)
    (out / "sglang-kv-scales.json").write_text(json.dumps(sglang_scales(scales, cfg.get("model_type", "")), indent=1))
    (out / "calibration.json").write_text(json.dumps({
        "split": "gsm8k train (quantrack/data/gsm8k/train.jsonl, hash-checked); the test split is not used",
        "samples": len(texts), "first": texts[0]["source"], "last": texts[-1]["source"], "strategy": a.strategy,
        "kv_cache_scheme": scheme, "max_seq_len": a.max_seq_len, "base_model": str(a.model),
        "versions": {"llmcompressor": llmcompressor.__version__, "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }, indent=1))
    print(f"wrote {out} ({len(scales)} layers of k/v scales; sglang-kv-scales.json; calibration.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
