"""Hostile checkpoint folders for the KV-scale plan (issue #43): every one gives ``unknown`` with the reason, opens
only regular files (a FIFO named model.safetensors never blocks) and ends in no traceback.

Each checkpoint is a folder the test writes: config.json and/or safetensors files in the real format (8-byte
little-endian header length, JSON header) with one field made hostile.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantrack.arms import make_arm
from quantrack.engines import plan_scales
from quantrack.engines.kvplan import ScaleSource, checkpoint_for

SCALE = "model.layers.0.self_attn.k_scale"
GOOD_CFG = json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "fp8"}})


def header_file(path: Path, raw: bytes, length: int | None = None) -> None:
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw)


def scale_header(shape_json: str) -> bytes:
    return ('{"' + SCALE + '": {"dtype": "F32", "shape": ' + shape_json + ', "data_offsets": [0, 4]}}').encode()


def folder(tmp: Path, name: str, *, cfg: str | None = GOOD_CFG) -> Path:
    d = tmp / name
    d.mkdir()
    if cfg is not None:
        (d / "config.json").write_text(cfg)
    return d


def _deep(n: int) -> str:
    return "[" * n + "]" * n


CONFIGS = {  # config.json alone
    "config nested 100,000 deep": '{"quantization_config": ' + _deep(100_000) + "}",
    "config nested 200 deep (under the parser's limit)": '{"quantization_config": {"kv_cache_scheme": {"x": '
                                                         + _deep(200) + "}}}",
    "quantization_config a string": '{"quantization_config": "fp8"}',
    "quant_method a list": '{"quantization_config": {"quant_method": ["fp8"]}}',
    "kv_cache_quant_algo an object": '{"quantization_config": {"kv_cache_quant_algo": {"a": 1}}}',
    "kv_cache_scheme a number": '{"quantization_config": {"kv_cache_scheme": 8}}',
    "config 1e400 inside kv_cache_scheme": '{"quantization_config": {"kv_cache_scheme": {"num_bits": 1e400}}}',
    "config a JSON list": "[1, 2]",
    "model_type a number": '{"model_type": 7}',
}
HEADERS = {  # a good config.json and a model.safetensors with this header (and length)
    "header nested 100,000 deep": (b'{"a": ' + _deep(100_000).encode() + b"}", None),
    "header length 2^63": (b"{}", 2**63),
    "header length 2^64-1": (b"{}", 2**64 - 1),
    **{f"shape {k}": (scale_header(v), None) for k, v in {
        "a string": '"abc"', "null": "null", "1e400": "[1e400]", "NaN": "[NaN]", "negative": "[-4]",
        "a float": "[2.5]", "true": "[true]", "an object": "{}", "a 5,000-digit integer": "[" + "9" * 5000 + "]",
    }.items()},
}


def _special(d: Path, case: str, tmp: Path) -> None:
    """What is not a regular file where one is read."""
    st = d / "model.safetensors"
    if case == "FIFO named model.safetensors":
        os.mkfifo(st)
    elif case == "FIFO named config.json":
        (d / "config.json").unlink()
        os.mkfifo(d / "config.json")
    elif case == "FIFO named hf_quant_config.json":
        os.mkfifo(d / "hf_quant_config.json")
    elif case == "model.safetensors links to /dev/zero":
        st.symlink_to("/dev/zero")
    elif case == "model.safetensors is a folder":
        st.mkdir()
    elif case == "config.json is a dangling link":
        (d / "config.json").unlink()
        (d / "config.json").symlink_to(tmp / "nowhere.json")
    else:
        raise AssertionError(case)


def build(tmp: Path, case: str) -> Path:
    """One hostile checkpoint folder per case name."""
    if case in CONFIGS:
        return folder(tmp, "ck", cfg=CONFIGS[case])
    d = folder(tmp, "ck")
    if case in HEADERS:
        raw, length = HEADERS[case]
        header_file(d / "model.safetensors", raw, length)
    else:
        _special(d, case, tmp)
    return d


CASES = ["config nested 100,000 deep", "config nested 200 deep (under the parser's limit)",
         "header nested 100,000 deep", "shape a string", "shape null", "shape 1e400", "shape NaN", "shape negative",
         "shape a float", "shape true", "shape an object", "shape a 5,000-digit integer",
         "FIFO named model.safetensors", "FIFO named config.json", "FIFO named hf_quant_config.json",
         "model.safetensors links to /dev/zero", "model.safetensors is a folder", "config.json is a dangling link",
         "header length 2^63", "header length 2^64-1", "quantization_config a string", "quant_method a list",
         "kv_cache_quant_algo an object", "kv_cache_scheme a number", "config 1e400 inside kv_cache_scheme",
         "config a JSON list", "model_type a number"]

# the words each refusal must carry (the reason, not just "unknown")
REASON = {"config nested 100,000 deep": "nested too deeply", "header nested 100,000 deep": "nested too deeply",
          "config nested 200 deep (under the parser's limit)": "nested deeper than 64 levels",
          "shape a string": 'shape "abc", not a list of non-negative integers', "shape null": "shape null",
          "shape 1e400": "1e400 is not finite", "shape NaN": "NaN is not a number JSON allows",
          "shape negative": "shape [-4]", "shape a float": "shape [2.5]", "shape true": "shape [true]",
          "shape an object": "shape {}", "shape a 5,000-digit integer": "4300 digits",
          "FIFO named model.safetensors": "model.safetensors is not a regular file (a FIFO)",
          "FIFO named config.json": "config.json is not a regular file (a FIFO)",
          "FIFO named hf_quant_config.json": "hf_quant_config.json is not a regular file (a FIFO)",
          "model.safetensors links to /dev/zero": "is not a regular file (a character device)",
          "model.safetensors is a folder": "is not a regular file (a folder)",
          "config.json is a dangling link": "config.json: file not found",
          "header length 2^63": "header length 9,223,372,036,854,775,808; at most 104,857,600 is read",
          "header length 2^64-1": "header length 18,446,744,073,709,551,615",
          "quantization_config a string": "quantization_config is str, not an object",
          "quant_method a list": 'quant_method is list ["fp8"], not a string',
          "kv_cache_quant_algo an object": "kv_cache_quant_algo is dict",
          "kv_cache_scheme a number": "kv_cache_scheme is int, not an object",
          "config 1e400 inside kv_cache_scheme": "1e400 is not finite",
          "config a JSON list": "expected a JSON object, found list", "model_type a number": "model_type is int"}


@pytest.mark.parametrize("case", CASES)
def test_hostile_checkpoint_is_unknown_with_its_reason(tmp_path: Path, case: str) -> None:
    d = build(tmp_path, case)
    start = time.monotonic()
    ck = checkpoint_for(str(d))
    assert time.monotonic() - start < 5, "reading the checkpoint must not block"
    assert ck is not None and not ck.read
    assert REASON[case] in ck.note, ck.note
    assert "\n" not in ck.note and len(ck.note) < 400
    arm = make_arm("fp8-kv", weights="fp8", kv="fp8", quantization="fp8")
    for engine in ("vllm", "sglang"):
        p = plan_scales(arm, engine, checkpoint=ck)
        assert p is not None and p.source == ScaleSource.UNKNOWN, (engine, p)
        assert REASON[case] in p.message


def test_a_valid_checkpoint_beside_the_hostile_ones_still_reads(tmp_path: Path) -> None:
    """The bounds do not refuse a real shape: a per-head scale of [8] and a scalar []."""
    d = folder(tmp_path, "ok")
    header_file(d / "model.safetensors", scale_header("[8]"))
    header_file(d / "b.safetensors", (b'{"model.layers.1.self_attn.v_scale": {"dtype": "F32", "shape": [], '
                                      b'"data_offsets": [0, 4]}}'))
    ck = checkpoint_for(str(d))
    assert ck is not None and ck.read and ck.scale_tensors == 2 and ck.scale_layout == "mixed"
    assert ck.quant_method == "fp8" and ck.model_type == "llama"


STUDY = """name = "hostile-ckpt"
context_len = 2048
[model]
name = "Llama-3-8B"
path = "{path}"
[engine]
kind = "vllm"
version = "0.25.0"
[gpu]
name = "H200"
[[arms]]
name = "bf16"
baseline = true
[[arms]]
name = "fp8-kv"
weights = "bf16"
kv = "fp8"
"""


@pytest.mark.parametrize("case", ["FIFO named model.safetensors", "config nested 100,000 deep", "shape 1e400",
                                  "header length 2^63"])
def test_preflight_says_unknown_and_why(tmp_path: Path, case: str) -> None:
    """The CLI: preflight finishes (no hang, no traceback) and its KV scales line says unknown with the reason."""
    d = build(tmp_path, case)
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(path=d))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "quantrack.cli", "preflight", "--study", str(study)],
                       capture_output=True, check=False, text=True, timeout=60, env=env, cwd=tmp_path)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    kv = [line for line in r.stdout.splitlines() if "KV scales:" in line]
    assert kv and kv[0].strip().startswith("KV scales: unknown [kv-checkpoint-unread]"), r.stdout + r.stderr
    assert REASON[case] in kv[0]
