"""Open-loop arrivals, goodput, repeats, the SLO search and the engine-metrics scrape (pure parts).

The llama.cpp /metrics text is real (tests/data/real/llamacpp-cpu/metrics-F16-kvf16.txt, xllamacpp 2026.10.11549)."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import pytest

from quantrack.errors import BadInput
from quantrack.measure.client import StreamSample
from quantrack.measure.load import (
    RequestSlo,
    achieved_rate,
    arrival_offsets,
    goodput,
    next_search_level,
    parse_criterion,
    parse_request_slo,
    repeat_stats,
    search_result,
    within_noise,
)
from quantrack.measure.scrape import Scrape, ScrapeLog, parse_prometheus, summarize_scrapes
from quantrack.measure.sweep import level_label, level_row, merge_repeats, range_lengths

DATA = Path(__file__).resolve().parents[1] / "data" / "real" / "llamacpp-cpu"


def test_poisson_arrivals_are_seeded_and_have_the_asked_mean_gap() -> None:
    a = arrival_offsets(4000, 5.0, "poisson", seed=7)
    assert a == arrival_offsets(4000, 5.0, "poisson", seed=7) and a != arrival_offsets(4000, 5.0, "poisson", seed=8)
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert a[0] == 0.0 and abs(statistics.mean(gaps) - 0.2) < 0.01  # mean 1/rate; 4000 draws: SE 0.003
    assert statistics.pstdev(gaps) > 0.15  # exponential: sd = mean, unlike the constant schedule
    c = arrival_offsets(5, 4.0, "constant")
    assert c == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert achieved_rate(c) == pytest.approx(4.0) and achieved_rate([1.0]) is None


def test_bad_arrivals_are_one_line_errors() -> None:
    with pytest.raises(BadInput, match=r"unknown arrival 'gamma'.*arrivals: poisson, constant"):
        arrival_offsets(3, 1.0, "gamma")
    with pytest.raises(BadInput, match=r"--rate must be a finite number of requests/s > 0 \(got inf\)"):
        arrival_offsets(3, float("inf"))


def test_request_slo_grammar_is_vllms_goodput() -> None:
    slo = parse_request_slo("ttft:500, tpot:50 e2el:10000")
    assert slo == RequestSlo(ttft_ms=500.0, tpot_ms=50.0, e2e_ms=10000.0)
    assert slo.text() == "ttft:500,tpot:50,e2e:10000"
    with pytest.raises(BadInput) as e:
        parse_request_slo("tft:500")
    assert str(e.value) == "--goodput 'tft:500': expected KEY:MS with KEY one of ttft, tpot, e2el (did you mean 'ttft'?)"
    with pytest.raises(BadInput, match="the limit must be a positive number of ms"):
        parse_request_slo("ttft:-1")
    with pytest.raises(BadInput, match="at most 200 characters"):
        parse_request_slo("ttft:1," * 100)
    with pytest.raises(BadInput, match=r"--goodput 'ttft:1': ttft is given twice \(one limit per metric\)"):
        parse_request_slo("ttft:5000,ttft:1")  # was: the last one kept silently


def test_goodput_counts_requests_meeting_every_limit() -> None:
    slo = RequestSlo(ttft_ms=100, tpot_ms=10)
    per = [(90.0, 9.0, 500.0, 32), (110.0, 9.0, 500.0, 32), (90.0, 11.0, 500.0, 32), (None, 9.0, 1.0, 32)]
    g = goodput(per, slo, wall_s=2.0, n_sent=5)
    assert g == {"slo": {"ttft_ms": 100, "tpot_ms": 10}, "n_good": 1, "fraction": 0.2, "request_s": 0.5,
                 "output_tok_s": 16.0}


def test_repeat_stats_t_interval_and_noise() -> None:
    st = repeat_stats([10.0, 12.0, 11.0])
    assert st is not None and st["mean"] == pytest.approx(11.0) and st["n"] == 3
    # t(0.975, 2) = 4.303; sd 1; half-width 4.303 / sqrt(3) = 2.484
    assert st["ci95_low"] == pytest.approx(11.0 - 2.4842, abs=1e-3)
    other = repeat_stats([20.0, 21.0, 22.0])
    assert within_noise(st, other) is False and within_noise(st, repeat_stats([12.0, 13.0, 14.0])) is True
    assert within_noise(repeat_stats([1.0]), st) is None  # one repeat: no interval, no claim
    assert repeat_stats([None, None]) is None


def test_criterion_and_bisection_over_measured_levels() -> None:
    c = parse_criterion("tpot_p95<=0.05s")
    assert (c.metric, c.stat, c.limit_ms) == ("tpot", "p95", 50.0)
    assert c.met({"tpot_ms": {"p95": 49.0}}) is True and c.met({"tpot_ms": {"p95": 51.0}}) is False
    assert c.met({"tpot_ms": None}) is None
    with pytest.raises(BadInput, match=r"unknown metric 'tpot_p96' \(did you mean 'tpot_p99'\?\)"):
        parse_criterion("tpot_p96<=3ms")
    with pytest.raises(BadInput, match="expected METRIC_STAT<=VALUE"):
        parse_criterion("tpot_p95 < 3ms")
    # concurrency: 1, 64 measured; 64 misses -> 32, 16 ... until adjacent
    v = {1.0: True, 64.0: False}
    assert next_search_level(v, integer=True) == 32.0
    v[32.0] = True
    assert next_search_level(v, integer=True) == 48.0
    v.update({48.0: False, 40.0: True, 44.0: True, 46.0: True, 47.0: False})
    assert next_search_level(v, integer=True) is None  # 46 meets, 47 misses: adjacent
    assert next_search_level({1.0: True, 4.0: True}, integer=True) is None  # nothing missed: no bound
    assert next_search_level({2.0: False}, integer=True) == 1.0
    assert next_search_level({1.0: False}, integer=True) is None
    assert next_search_level({1.0: True, 2.0: False}, integer=False) == 1.5
    assert next_search_level({1.9: True, 2.0: False}, integer=False) is None  # within 10%
    r = search_result(c, v, {k: None for k in v}, "concurrency")
    assert r["limit"] == 46 and r["first_miss"] == 47 and r["bounded"] is True
    assert search_result(c, {1.0: True, 4.0: True}, {}, "concurrency")["limit"] == 4
    none = search_result(c, {1.0: False}, {}, "rate")
    assert none["limit"] is None and none["first_miss"] == 1.0


def _sample(ttft: float, e2e: float, n: int = 8) -> StreamSample:
    step = (e2e - ttft) / (n - 1)
    return StreamSample(chunk_times=[ttft + i * step for i in range(n)], completion_tokens=n, done=True)


def test_level_row_p95_goodput_rate_and_repeats() -> None:
    samples = [_sample(0.1 * (i + 1), 0.1 * (i + 1) + 0.7) for i in range(10)]  # TPOT 100 ms each
    row = level_row(None, samples, 4.0, rate=2.0, sent_at=[0.0, 0.5, 1.0, 1.5], lag_s=[0.0, 0.001, 0.002, 0.01],
                    slo=RequestSlo(ttft_ms=500), client_cpu_s=0.08)
    assert row["mode"] == "rate" and level_label(row) == "r2" and row["achieved_rate"] == pytest.approx(2.0)
    assert row["ttft_ms"]["p95"] == pytest.approx(955.0)  # linear between 900 and 1000
    assert row["tpot_p95_ms"] == pytest.approx(100.0)
    assert row["goodput"]["n_good"] == 5 and row["goodput_request_s"] == pytest.approx(1.25)
    assert row["client_cpu_ms_per_token"] == pytest.approx(1.0)  # 80 ms / 80 tokens
    assert row["mean_in_flight"] == pytest.approx(sum(0.1 * (i + 1) + 0.7 for i in range(10)) / 4.0)
    assert row["dispatch_lag_ms"]["max"] == pytest.approx(10.0)
    runs = [level_row(4, samples, w) for w in (2.0, 2.5, 3.0)]
    merged = merge_repeats(runs, level_row(4, samples * 3, 7.5))
    st = merged["repeat_stats"]["output_tok_s"]
    assert merged["output_tok_s"] == pytest.approx(statistics.mean([40.0, 32.0, 80 / 3]))
    assert st["n"] == 3 and st["ci95_low"] < merged["output_tok_s"] < st["ci95_high"]
    assert merged["requests"] == 30 and merged["repeats"] == 3 and level_label(merged) == "c4"


def test_prometheus_text_from_the_real_llamacpp_server() -> None:
    series = parse_prometheus((DATA / "metrics-F16-kvf16.txt").read_text())
    assert series["llamacpp:prompt_tokens_total"] == 45 and series["llamacpp:prompt_tokens_cached_total"] == 84
    assert series["llamacpp:requests_processing"] == 0
    labelled = parse_prometheus('vllm:num_requests_running{engine="0",model_name="m"} 3\n'
                                'vllm:num_requests_running{engine="1",model_name="m"} 2\n# TYPE x gauge\nbad line\n')
    assert labelled == {"vllm:num_requests_running": 5.0}


def test_scrape_summary_says_what_llamacpp_does_not_serve() -> None:
    base = parse_prometheus((DATA / "metrics-F16-kvf16.txt").read_text())
    later = dict(base, **{"llamacpp:requests_processing": 2.0, "llamacpp:requests_deferred": 3.0,
                          "llamacpp:prompt_tokens_total": 145.0, "llamacpp:prompt_tokens_cached_total": 94.0})
    log = ScrapeLog("llamacpp", samples=[Scrape(0.0, base, 0), Scrape(0.5, later, 2), Scrape(1.0, base, 1)])
    out = summarize_scrapes(log)
    assert out["running_max"] == 2 and out["waiting_max"] == 3 and out["busy_slots_max"] == 2
    assert out["prefix_cache_hit_rate"] is None  # counters back at the start: no increase over the level
    log.samples[-1] = Scrape(1.0, later, 0)
    out = summarize_scrapes(log)
    assert out["prefix_cache_hit_rate"] == pytest.approx(10 / 110)
    assert out["kv_usage_max"] is None and out["unknown"]["kv_usage_max"] == "llamacpp serves no kv_usage series"
    assert out["preemptions"] is None and "no preemption counter" in out["unknown"]["preemptions"]
    vllm = ScrapeLog("vllm", samples=[
        Scrape(0, {"vllm:kv_cache_usage_perc": 0.1, "vllm:num_preemptions_total": 2, "vllm:prefix_cache_hits_total": 0,
                   "vllm:prefix_cache_queries_total": 0}),
        Scrape(1, {"vllm:kv_cache_usage_perc": 0.9, "vllm:num_preemptions_total": 5,
                   "vllm:prefix_cache_hits_total": 16, "vllm:prefix_cache_queries_total": 64})])
    v = summarize_scrapes(vllm)
    assert v["kv_usage_max"] == 0.9 and v["kv_usage_mean"] == pytest.approx(0.5) and v["preemptions"] == 3
    assert v["prefix_cache_hit_rate"] == 0.25
    empty = summarize_scrapes(ScrapeLog("vllm", errors=["/metrics answered HTTP 404"]))
    assert empty["n_scrapes"] == 0 and empty["unknown"]["running_max"] == "/metrics answered HTTP 404"


def test_range_ratio_lengths_are_vllms_uniform_integers() -> None:
    assert range_lengths(5, 100, 0.0, seed=1) == [100] * 5
    got = range_lengths(2000, 100, 0.5, seed=1)
    assert got == range_lengths(2000, 100, 0.5, seed=1) and min(got) == 50 and max(got) == 150
    assert abs(statistics.mean(got) - 100) < 2  # uniform on [50, 150]: SE 0.65
    assert min(range_lengths(50, 4, 0.9, seed=2, minimum=2)) >= 2


def _row(arm: str, metrics: dict[str, float], tags: dict[str, str] | None = None) -> object:
    from quantrack.store.records import RunRow

    return RunRow(run_id=f"id-{arm}", experiment_id="1", run_name=arm, status="FINISHED", start_time=1,
                  end_time=2, params={}, metrics=metrics,
                  tags={"quantrack.arm": arm, "quantrack.baseline": "true" if arm == "a" else "false", **(tags or {})})


def test_compare_wide_load_columns_and_noise_note() -> None:
    from quantrack.report.compare import build_table, render
    from quantrack.report.judge import load_explanation

    base = {"sweep_output_tps_c4": 100.0, "sweep_output_tps_ci_low_c4": 95.0, "sweep_output_tps_ci_high_c4": 105.0,
            "sweep_tpot_ms_p95_c4": 12.5, "sweep_engine_kv_usage_max_c4": 0.35, "sweep_engine_running_max_c4": 4.0,
            "sweep_engine_waiting_max_c4": 0.0, "sweep_output_tps_c1": 30.0}
    arm = dict(base, sweep_output_tps_c4=103.0, sweep_output_tps_ci_low_c4=99.0, sweep_output_tps_ci_high_c4=107.0,
               sweep_engine_kv_usage_max_c4=0.97, sweep_engine_preemptions_c4=3.0, sweep_engine_waiting_max_c4=5.0,
               sweep_goodput_rps_c4=1.5, sweep_goodput_fraction_c4=0.75, sweep_slo_limit=2.0)
    tags = {"quantrack.sweep_slo_search": "tpot_p95<=50ms", "quantrack.sweep_slo_search_mode": "concurrency",
            "quantrack.sweep_slo_search_first_miss": "3"}
    t = build_table("x", [_row("a", base), _row("b", arm, tags)], baseline="a")  # type: ignore[list-item]
    wide = render(t, "table", wide=True)
    for head in ("Sweep level", "Sweep out tok/s", "TPOT p95", "Goodput req/s", "Engine KV / run / wait", "SLO limit"):
        assert head in wide
    rows = {r["arm"]: r for r in t.rows}
    assert rows["a"]["sweep_tps"] == "100.0 [95.0–105.0]" and rows["a"]["engine_view"] == "0.35 / 4 / 0"
    assert rows["a"]["goodput"] == "— (no goodput SLO)" and rows["a"]["slo_limit"] == "— (no slo_search)"
    assert rows["b"]["goodput"] == "1.500" and rows["b"]["slo_limit"] == "c2 (tpot_p95<=50ms; first miss c3)"
    assert any("≈ sweep throughput of b at c4 lies within run-to-run noise of a" in n for n in t.notes)
    assert "sweep_levels" in t.raw[1] and t.raw[1]["sweep_levels"]["c4"]["engine_preemptions"] == 3.0
    # the prefix-cache hit rate of the top level, with the workload; unknown says so (and the json says why)
    assert "Prefix hit" in wide
    assert rows["a"]["prefix_hit"] == "unknown" and rows["b"]["prefix_hit"] == "unknown"
    hit = dict(arm, sweep_engine_prefix_hit_rate_c4=0.5)
    why = {"quantrack.sweep_prefix_cache_unknown": "/metrics: llamacpp serves no prefix-cache counter"}
    t2 = build_table("x", [_row("a", base, {**why, "quantrack.sweep_dataset": "random"}),  # type: ignore[list-item]
                           _row("b", hit, {**tags, "quantrack.sweep_dataset": "shared-prefix"})], baseline="a")
    rows2 = {r["arm"]: r for r in t2.rows}
    assert rows2["a"]["prefix_hit"] == "unknown (random)" and rows2["b"]["prefix_hit"] == "50.0% (shared-prefix)"
    assert t2.raw[0]["prefix_cache_unknown"] == why["quantrack.sweep_prefix_cache_unknown"]
    expl = load_explanation(_row("b", arm, tags))  # type: ignore[arg-type]
    assert expl[0].startswith("SLO search tpot_p95<=50ms: highest measured level meeting it c2; first miss c3")
    assert expl[1] == "goodput at c4: 1.5 req/s (75% of requests met every per-request SLO)"
    assert "KV cache peaked at 97%, 3 preemptions, up to 5 waiting: capacity-bound" in expl[2]
    assert "the cache never filled" in load_explanation(_row("a", base))[0]  # type: ignore[arg-type]
    # a run without load figures keeps the old columns (goldens unchanged)
    plain = build_table("x", [_row("a", {"sweep_output_tps_c4": 1.0})], baseline="a")  # type: ignore[list-item]
    assert "Sweep level" not in render(plain, "table", wide=True)


def test_sweep_render_warns_on_ramp_and_drain_and_shows_the_search() -> None:
    from quantrack.cli.sweep import _render_sweep
    from quantrack.measure.sweep import SWEEP_FORMULAS

    samples = [_sample(0.1, 0.8) for _ in range(4)]
    r4 = level_row(4, samples, 1.0)  # 4 x 0.8 s busy in 1 s: 80% of 4 in flight
    r4["search"] = True
    data = {"label": "x", "engine": "llamacpp", "base_url": "http://h", "model": "m", "input_tokens": 16,
            "prompt": "exact", "output_tokens": 8, "rows": [level_row(1, samples[:1], 0.8), r4],
            "load": {"slo": {"ttft_ms": 500.0}, "repeats": 1}, "interrupted": False, "formulas": SWEEP_FORMULAS,
            "slo_search": {"criterion": "tpot_p95<=50ms", "mode": "concurrency", "limit": 1, "first_miss": 4}}
    text = _render_sweep(data)
    assert "⚠ mean requests in flight / level below 90% (ramp-up and drain inside the wall time): c4 80%" in text
    assert "c1 " not in text.split("⚠", 1)[1]  # c1: 0.8 s busy in 0.8 s = 100%
    assert "SLO search tpot_p95<=50ms: highest measured concurrency meeting it: 1; first miss 4" in text
    assert "c4*" in text and "goodput SLO (per request, ms): ttft_ms <= 500" in text


@pytest.mark.parametrize("args, msg", [
    (["--goodput", "tft:5"], "--goodput 'tft:5': expected KEY:MS with KEY one of ttft, tpot, e2el (did you mean 'ttft'?)"),
    (["--slo-search", "tpot_p95<=5"], "--slo-search 'tpot_p95<=5': the limit must be a positive number with a unit"),
    (["--rate", "0"], "--rate: expected a list of numbers in [0.001, 1000000] (slower than one request per 1000 s outlasts every request timeout), got [0.0]"),
    (["--arrival", "gamma"], "--arrival"),
    (["--rate", "1", "--concurrency", "2", "--slo-search", "tpot_p95<=5ms"], "--slo-search bisects one kind of level"),
])
def test_sweep_bad_load_options_are_one_line_exit_2(args: list[str], msg: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    with pytest.raises(SystemExit) as e:
        main(["sweep", "--engine", "llamacpp", "--base-url", "http://127.0.0.1:9", *args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and msg in err, err
