"""Latency arithmetic: statistics, TPOT/ITL per sample, rows, merge, speedup ratios and plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from quantrack.measure.client import StreamSample
from quantrack.measure.latency import LatencyResult, flatten_row, load_latency_rows
from quantrack.measure.prompts import build_prompts
from quantrack.measure.stats import pct_diff, percentile, summarize
from quantrack.measure.sweep import level_row
from quantrack.report.plots import plot_speedup, speedup_points, sweep_rows_from_file

VALUES = [12.5, 11.0, 13.25, 10.5, 12.0, 30.0, 11.75]


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    assert percentile(VALUES, q) == pytest.approx(float(np.percentile(VALUES, q)))


def test_summary_ci_is_student_t() -> None:
    s = summarize(VALUES)
    assert s is not None
    lo, hi = sps.t.interval(0.95, len(VALUES) - 1, loc=np.mean(VALUES), scale=sps.sem(VALUES))
    assert (s.ci95_low, s.ci95_high) == (pytest.approx(lo), pytest.approx(hi))
    assert s.median == pytest.approx(float(np.median(VALUES)))
    assert s.std == pytest.approx(float(np.std(VALUES, ddof=1)))
    assert summarize([]) is None
    one = summarize([4.0])
    assert one is not None and one.ci95_low is None and one.median == 4.0


def test_tpot_from_llamacpp_log_format() -> None:
    """Chunks at the cadence of a real print_timing line give that line's per-token figure.

    Log line (shared data, xllamacpp-Q4_0-kvf16.log, format in engine-facts.md §1.5):
    ``eval time =     199.80 ms /    32 tokens (    6.45 ms per token`` with per token = X / (N - 1).
    """
    eval_ms, n = 199.80, 32
    step = eval_ms / (n - 1) / 1000.0
    s = StreamSample(chunk_times=[0.05 + i * step for i in range(n)], completion_tokens=n, done=True)
    assert s.tpot is not None and round(s.tpot * 1000, 2) == 6.45
    assert s.ttft == 0.05 and s.e2e == pytest.approx(0.05 + eval_ms / 1000)
    assert len(s.itl) == n - 1 and s.itl[0] == pytest.approx(step)


def test_result_excludes_failed_samples_and_compares_server() -> None:
    good = [
        StreamSample(chunk_times=[0.1, 0.2, 0.3], completion_tokens=3, done=True, server_timings={"predicted_per_token_ms": 100.0}),
        StreamSample(chunk_times=[0.1, 0.22, 0.34], completion_tokens=3, done=True, server_timings={"predicted_per_token_ms": 110.0}),
    ]
    bad = StreamSample(ok=False, error="short: server returned 1 of 3 tokens", chunk_times=[0.01], completion_tokens=1)
    r = LatencyResult(engine="llamacpp", base_url="http://u:p@127.0.0.1:1", model="m", input_tokens=4, output_tokens=3, warmup=0, iterations=3)
    r.samples = [*good, bad]
    row = r.to_row()
    assert row["n_ok"] == 2 and row["n_failed"] == 1
    assert row["failures"] == {"short: server returned 1 of 3 tokens": 1}
    assert row["tpot_ms"]["n"] == 2 and row["tpot_ms"]["median"] == pytest.approx((100.0 + 120.0) / 2)
    assert row["server_tpot_ms"]["median"] == pytest.approx(105.0)
    assert row["tpot_vs_server_median_pct"] == pytest.approx(pct_diff(110.0, 105.0))
    assert row["ttft_ms"]["min"] == pytest.approx(100.0)  # the failed sample's 10 ms is not in
    assert row["base_url"] == "http://127.0.0.1:1"  # credentials in the URL are not saved
    assert set(row["formulas"]) >= {"ttft", "tpot", "itl", "e2e"}


def test_merge_reads_saved_and_lab_rows(tmp_path: Path, shared_data: Path) -> None:
    r = LatencyResult(engine="vllm", base_url="http://127.0.0.1:8000", model="m", input_tokens=8, output_tokens=3, warmup=0, iterations=1, label="mine")
    r.samples = [StreamSample(chunk_times=[0.1, 0.2, 0.3], completion_tokens=3, done=True)]
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(r.to_row()))
    lab = shared_data / "vllm-h200" / "client-latency-bf16.json"
    recs = load_latency_rows([str(mine), str(lab)])
    lab_obj = json.loads(lab.read_text())
    assert recs[0]["label"] == "mine" and recs[0]["tpot_ms"] == pytest.approx(100.0)
    assert recs[1]["label"] == lab_obj["label"] and recs[1]["tpot_ms"] == lab_obj["batch1"]["tpot_ms"]
    assert "not stated" in recs[1]["statistic"]
    with pytest.raises(Exception, match="is not a latency row"):
        flatten_row({"x": 1}, "x.json")


def test_level_row_throughput() -> None:
    samples = [StreamSample(chunk_times=[0.1 * i, 0.1 * i + 0.3], completion_tokens=2, done=True) for i in range(1, 4)]
    samples.append(StreamSample(ok=False, error="connection refused"))
    row = level_row(4, samples, wall_s=2.0)
    assert row["output_tokens"] == 6 and row["output_tok_s"] == pytest.approx(3.0)
    assert row["n_ok"] == 3 and row["n_failed"] == 1 and row["failures"] == {"connection refused": 1}
    assert row["tpot_p50_ms"] == pytest.approx(300.0)
    # --concurrency text is parsed by the SweepSpec.concurrency setting (tests/unit/test_cli_settings.py)


def test_speedup_from_real_lab_rows(shared_data: Path, tmp_path: Path) -> None:
    base = shared_data / "vllm-h200" / "client-latency-bf16.json"
    arm = shared_data / "vllm-h200" / "client-latency-fp8.json"
    la, rows_a = sweep_rows_from_file(base)
    lb, rows_b = sweep_rows_from_file(arm)
    a, b = json.loads(base.read_text()), json.loads(arm.read_text())
    pts = {p["concurrency"]: p for p in speedup_points(rows_a, rows_b)}
    assert pts[16]["throughput_ratio"] == pytest.approx(b["conc16"]["out_tok_per_s"] / a["conc16"]["out_tok_per_s"])
    assert pts[64]["tpot_ratio"] == pytest.approx(a["conc64"]["tpot_ms"] / b["conc64"]["tpot_ms"])
    assert pts[1]["throughput_ratio"] is None  # batch1 has no throughput: left out, not guessed
    out = plot_speedup(rows_a, rows_b, tmp_path / "s.png", label_a=la, label_b=lb)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_prompts_exact_distinct_and_salted_per_run() -> None:
    """Every prompt is exactly n ids and none repeats, within a run or across two runs."""

    def tokenize(text: str) -> list[int]:  # stand-in tokenizer: one id per character
        return [ord(ch) for ch in text]

    run1 = build_prompts(5, 40, tokenize, chat=False, source="test")
    run2 = build_prompts(5, 40, tokenize, chat=False, source="test")
    assert run1.exact and all(len(p) == 40 for p in run1.prompts)
    firsts = [tuple(p[:8]) for p in run1.prompts + run2.prompts]
    assert len(set(firsts)) == 10
    same = build_prompts(2, 40, tokenize, chat=False, source="test", salt="fixed")
    assert same.prompts == build_prompts(2, 40, tokenize, chat=False, source="test", salt="fixed").prompts
    chat = build_prompts(2, 40, tokenize, chat=True, source="test")
    assert not chat.exact and all(isinstance(p, str) and len(p) <= 40 for p in chat.prompts)
