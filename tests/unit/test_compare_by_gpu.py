"""A fleet experiment holds the same arms on several GPUs: `compare` gives one table per GPU."""

from __future__ import annotations

import json

import pytest

from quantrack.errors import BadInput
from quantrack.report.compare import compare_by_gpu, render_many
from quantrack.store.records import MetricPoint, RunRecord
from quantrack.store.tracking import log_arm

EXP = "fleet-two-gpus"


def _arm(uri: str, arm: str, gpu: str, tpot: float, baseline: bool) -> None:
    rec = RunRecord(experiment=EXP, run_name=arm)
    rec.tag("quantrack.role", "arm")
    rec.tag("quantrack.arm", arm)
    if baseline:
        rec.tag("quantrack.baseline", "true")
    rec.param("weights", "bf16" if arm == "bf16" else "fp8")
    rec.param("gpu_name", gpu)
    rec.metrics.append(MetricPoint("tpot_ms_p50", tpot))
    log_arm(rec, uri, EXP)


@pytest.fixture
def uri(tmp_path) -> str:
    u = f"sqlite:///{tmp_path}/mlflow.db"
    for gpu, base_tpot in (("H100", 5.0), ("A100-80GB", 7.0)):
        _arm(u, "bf16", gpu, base_tpot, True)
        _arm(u, "fp8", gpu, base_tpot * 0.7, False)
    return u


def test_one_table_per_gpu_each_with_its_own_rows(uri: str) -> None:
    tables = compare_by_gpu(EXP, uri=uri)
    assert [t.experiment for t in tables] == [f"{EXP} @ A100-80GB", f"{EXP} @ H100"]
    for t in tables:
        assert [r["arm"] for r in t.rows] == ["bf16", "fp8"]
        assert not t.skipped  # nothing collapsed across GPUs
    text = render_many(tables, "table", wide=True)
    assert "7.00 ms" in text and "5.00 ms" in text and "4.90 ms" in text and "3.50 ms" in text
    both = json.loads(render_many(tables, "json"))
    assert len(both["tables"]) == 2


def test_gpu_filter_and_unknown_gpu(uri: str) -> None:
    (only,) = compare_by_gpu(EXP, uri=uri, gpu="h100")
    assert only.experiment == EXP and [r["arm"] for r in only.rows] == ["bf16", "fp8"]
    with pytest.raises(BadInput, match=r"^no runs on GPU 'H10' in experiment 'fleet-two-gpus' \(did you mean"):
        compare_by_gpu(EXP, uri=uri, gpu="H10")
