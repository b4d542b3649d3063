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
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MAX_SEQ_LEN = 1_048_576  # the longest context any engine here serves
CALIBRATE_EXTRA = ("torch", "transformers", "llmcompressor", "compressed_tensors", "datasets")


class BadArgs(Exception):
    """A bad input to the script: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2 (argparse's own prints the usage too)
        raise BadArgs(message)


def calibration_texts(n: int) -> list[dict[str, Any]]:
    """The first ``n`` GSM8K train examples as {"text", "source"}; refuses any overlap with the test split."""
    from quantrack.accuracy.gsm8k import load_data

    data = load_data(num_shots=0)
    if not 1 <= n <= len(data.train):
        raise BadArgs(f"--samples must be between 1 and {len(data.train)} (the train split), got {n}")
    test_questions = {row["question"].strip() for row in data.test}
    out = []
    for i, row in enumerate(data.train[:n]):
        q = row["question"].strip()
        if q in test_questions:
            raise BadArgs(f"train line {i + 1} is also a test question: refusing to calibrate on it")
        out.append({"text": f"Question: {q}\nAnswer: {row['answer'].strip()}", "source": f"gsm8k/train.jsonl:{i + 1}"})
    return out


def kv_scheme(strategy: str) -> dict[str, Any]:
    """The compressed-tensors kv_cache_scheme vLLM accepts: 8-bit float, symmetric, tensor or attn_head
    (vllm@dd10e03f9:vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py:L972-L1010)."""
    if strategy not in ("tensor", "attn_head"):
        raise BadArgs(f"--strategy must be tensor or attn_head, got {strategy!r}")
    return {"num_bits": 8, "type": "float", "strategy": strategy, "dynamic": False, "symmetric": True}


def sglang_scales(layer_scales: dict[int, tuple[list[float], list[float]]], model_type: str) -> dict[str, Any]:
    """SGLang's QuantParamSchema for TP 1 (sglang@v0.5.16 python/sglang/srt/model_loader/weight_utils.py:L1610-L1681):
    one scale per layer, the max over K and V (and over heads for attn_head scales)."""
    factors = {}
    for layer, (k, v) in sorted(layer_scales.items()):
        s = max([*k, *v])
        if not (s > 0 and math.isfinite(s)):
            raise BadArgs(f"layer {layer}: scale {s!r} is not a positive number")
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

    from safetensors import SafetensorError, safe_open

    from quantrack.errors import QuantrackError
    from quantrack.store.files import open_regular_read

    pat = re.compile(r"\.layers\.(\d+)\.self_attn\.([kv])_scale$")
    found: dict[int, dict[str, list[float]]] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        try:
            open_regular_read(f).close()  # a FIFO, a device or a folder is refused, never opened blocking
        except QuantrackError as exc:
            raise BadArgs(str(exc)) from None
        try:
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
        except (SafetensorError, OSError, ValueError, KeyError, RecursionError) as exc:
            why = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise BadArgs(f"{f}: not a readable safetensors file ({why})") from None
    if not found:
        raise BadArgs(f"{ckpt}: no self_attn.k_scale / v_scale tensors were saved")
    return {i: (d.get("k", []), d.get("v", [])) for i, d in found.items()}


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="bf16 Hugging Face checkpoint directory")
    ap.add_argument("--out", required=True, help="output directory (must not exist)")
    ap.add_argument("--strategy", default="tensor", choices=["tensor", "attn_head"])
    ap.add_argument("--samples", type=int, default=512, help="GSM8K train examples (from the first)")
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--finish", action="store_true",
                    help="--out holds a checkpoint this script saved but did not finish: write only the SGLang scales "
                         "file and calibration.json from it (same arguments as the first call)")
    return ap


def _config(path: Path, flag: str) -> dict[str, Any]:
    """A checkpoint's config.json: a regular file holding a JSON object (one line otherwise)."""
    from quantrack.errors import QuantrackError
    from quantrack.store.files import read_regular

    try:
        raw = read_regular(path, limit=64 * 2**20, what=f"{flag}: {path}")
        cfg = json.loads(raw)
    except QuantrackError as exc:
        raise BadArgs(str(exc)) from None
    except (ValueError, RecursionError):
        raise BadArgs(f"{flag}: {path} is not JSON") from None
    if not isinstance(cfg, dict):
        raise BadArgs(f"{flag}: {path} is not a JSON object")
    return cfg


def check_args(a: argparse.Namespace) -> Path:
    """Everything checked before the model is loaded (a calibration takes minutes on a GPU): the output folder can
    be made, the model is a local checkpoint, every number is in range; with --finish, the saved checkpoint reads."""
    if not 1 <= a.max_seq_len <= MAX_SEQ_LEN:
        raise BadArgs(f"--max-seq-len must be between 1 and {MAX_SEQ_LEN:,}, got {a.max_seq_len:,}")
    out = Path(a.out)
    if a.finish:
        if not os.path.lexists(out / "config.json"):
            raise BadArgs(f"--finish: {out} holds no saved checkpoint")
        _config(out / "config.json", "--finish")
        read_layer_scales(out)
        return out
    if os.path.lexists(out):
        raise BadArgs(f"--out {out}: exists; give a new directory")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise BadArgs(f"--out {out}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadArgs(f"--out {out}: the folder {parent} is not writable")
    model = Path(a.model)
    if not model.is_dir():
        raise BadArgs(f"--model {model}: not a local checkpoint directory")
    _config(model / "config.json", "--model")
    return out


def check_extra() -> None:
    import importlib.util

    missing = [m for m in CALIBRATE_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        raise BadArgs(f"needs the [calibrate] extra (pip install -e '.[calibrate]'): {', '.join(missing)} not "
                      "installed")


def main(argv: list[str] | None = None) -> int:
    try:
        a = _parser().parse_args(argv)
        out = check_args(a)
        texts = calibration_texts(a.samples)
        scheme = kv_scheme(a.strategy)
        check_extra()
    except BadArgs as exc:
        print(f"calibrate_kv: error: {exc}", file=sys.stderr)
        return 2
    # the [calibrate] extra is imported inside the steps, so --help and the tests need none of it
    if not a.finish:
        _calibrate(a, texts, scheme, out)
    from quantrack.errors import QuantrackError

    try:
        return _write_side_files(a, texts, scheme, out)
    except (BadArgs, QuantrackError, OSError) as exc:  # the calibrated checkpoint is saved: --finish writes these files from it
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        print(f"calibrate_kv: error: {why}; the checkpoint is in {out}: fix it and rerun with --finish",
              file=sys.stderr)
        return 1


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
    cfg = _config(out / "config.json", "--out")
    scales = read_layer_scales(out)
    sglang = json.dumps(sglang_scales(scales, str(cfg.get("model_type", ""))), indent=1)

    import llmcompressor
    import torch
    import transformers

    from quantrack.store.files import write_atomic

    write_atomic(out / "sglang-kv-scales.json", sglang)
    write_atomic(out / "calibration.json", json.dumps({
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
