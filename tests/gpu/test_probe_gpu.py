"""The real probe on an NVIDIA GPU (skipped without CUDA; run on the H200 node)."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_probe_times_bf16_and_fp8_on_this_gpu():
    from quantrack.hardware import catalog
    from quantrack.hardware.probe import run_probe

    res = run_probe(catalog.get_model("Llama-3-8B"), [1, 64], repeats=5, warmup=2, copy_gib=0.5)
    assert res.copy_tbps and res.copy_tbps > 0.1
    assert all(b.bf16_stack_ms > 0 for b in res.batches)
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor >= 89:
        assert res.verdict == "native", res.evidence
