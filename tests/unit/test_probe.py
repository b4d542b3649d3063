"""Probe logic on CPU: shapes, L2-flush copies, summary and verdict. GPU timing is in tests/gpu/."""

import json

import pytest

from quantrack.errors import BadInput
from quantrack.hardware import catalog
from quantrack.hardware.probe import (
    LayerTiming,
    linear_shapes,
    parse_batches,
    summarize,
    verdict,
    weight_copies,
)


def test_llama3_8b_linear_shapes_match_the_reference_probe(shared_data):
    shapes = {s.layer: (s.k, s.n) for s in linear_shapes(catalog.get_model("Llama-3-8B"))}
    ref = json.loads((shared_data / "vllm-h200" / "gemm-probe-h200.json").read_text())
    for row in ref["rows"]:
        if "K" in row:
            assert shapes[row["layer"]] == (row["K"], row["N"])


def test_weight_copies_flush_l2():
    # 4096 x 4096 bf16 = 32 MiB -> 8 copies to touch 256 MiB; huge weights still get 2
    assert weight_copies(4096, 4096, 2) == 8
    assert weight_copies(4096, 4096, 1) == 16
    assert weight_copies(16384, 65536, 2) == 2


def test_parse_batches_rejects_bad_values():
    assert parse_batches("1,16, 64") == [1, 16, 64]
    for bad in ("", "0", "1,x", "-4"):
        with pytest.raises(BadInput):
            parse_batches(bad)


def _rows_from_reference(ref):
    rows = []
    for r in ref["rows"]:
        if "K" in r:
            rows.append(LayerTiming(batch=r["M"], layer=r["layer"], k=r["K"], n=r["N"], bf16_ms=r["bf16_ms"],
                                    fp8_tensor_ms=r["fp8_ms"], fp8_channel_ms=None, bf16_gbps=0, fp8_gbps=0))
    return rows


def test_summary_reproduces_the_reference_stack_speedups(shared_data):
    ref = json.loads((shared_data / "vllm-h200" / "gemm-probe-h200.json").read_text())
    summary = {b.batch: b for b in summarize(_rows_from_reference(ref), 32, ref["copy_TBps_rw"])}
    for r in ref["rows"]:
        if r["layer"] == "SUM(1 layer)":
            b = summary[r["M"]]
            assert b.speedup == pytest.approx(r["speedup"], rel=1e-9)
            assert b.bf16_stack_ms == pytest.approx(r["decode_step_32L_bf16_ms"], rel=1e-9)
    assert summary[1].speedup == pytest.approx(1.366, abs=0.001)
    assert summary[1024].speedup == pytest.approx(1.776, abs=0.001)
    assert 0 < summary[1].bf16_bw_fraction < 1
    assert verdict(list(summary.values()), None)[0] == "native"


def test_verdict_none_when_fp8_missing_or_not_faster():
    slow = [LayerTiming(1, "o", 4096, 4096, 0.02, 0.025, None, 0, 0)]
    v, ev = verdict(summarize(slow, 32, None), None)
    assert v == "none" and "no faster path" in ev[-1]
    v, ev = verdict([], "torch._scaled_mm per-tensor: RuntimeError: not supported")
    assert v == "none" and "unavailable" in ev[0]


def test_probe_without_cuda_is_one_line_exit_2():
    import subprocess
    import sys

    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA present: tests/gpu covers the real probe")
    except ImportError:
        pass
    p = subprocess.run([sys.executable, "-m", "quantrack.cli", "probe", "--batch", "1"], check=False, capture_output=True,
                       text=True)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and ("PyTorch" in lines[0] or "CUDA" in lines[0]), lines
    assert "Traceback" not in p.stderr
