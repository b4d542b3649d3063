"""The SLO search that measures (quantrack.measure.search) against a simulated server.

The simulated server: TTFT p95 is flat (150 ms) below its knee and rises linearly above it (4,000 ms per knee
of extra rate), each repeat with seeded multiplicative noise of +-3%; it finishes requests at most at
``capacity`` requests/s (above that, requests queue in the server). With a 1,000 ms criterion the known limit is
knee x (1 + 850 / 4000)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from quantrack.errors import BadInput
from quantrack.measure.load import parse_criterion
from quantrack.measure.search import (
    ProbeSpec,
    bracket_text,
    completion_rate,
    outcome_from_row,
    probe_bound,
    probe_search,
    probe_spec,
    saturation,
)

CRIT = parse_criterion("ttft_p95<=1000ms")


class SimServer:
    def __init__(self, knee: float, seed: int, capacity: float = 1e9, noise: float = 0.03,
                 mode: str = "rate") -> None:
        self.knee, self.capacity, self.noise, self.mode = knee, capacity, noise, mode
        self.rng = random.Random(seed)
        self.probed: list[float] = []

    @property
    def limit(self) -> float:  # where the noiseless p95 crosses 1,000 ms
        return self.knee * (1 + 850 / 4000)

    def p95(self, x: float) -> float:
        base = 150.0 if x <= self.knee else 150.0 + 4000.0 * (x - self.knee) / self.knee
        return base * (1 + self.rng.uniform(-self.noise, self.noise))

    def row(self, x: float, repeats: int) -> dict[str, Any]:
        """A sweep row as :class:`quantrack.measure.sweep._Levels` merges repeats (``runs`` per repeat)."""
        self.probed.append(x)
        runs = [{"mode": self.mode, "rate": x, "ttft_ms": {"p95": self.p95(x)}, "achieved_rate": x,
                 "completion_rate": min(x, self.capacity), "n_ok": 16} for _ in range(repeats)]
        pooled = sum(r["ttft_ms"]["p95"] for r in runs) / repeats
        row: dict[str, Any] = {"mode": self.mode, "rate": x, "n_ok": 16 * repeats, "ttft_ms": {"p95": pooled}}
        if repeats > 1:
            row["runs"] = runs
        else:
            row.update(runs[0])
        return row

    def measure(self, spec: ProbeSpec) -> Any:
        return lambda x: outcome_from_row(CRIT, self.row(x, spec.repeats), x, spec.margin)


@pytest.mark.parametrize("knee, seed", [(3.0, 1), (7.7, 2), (12.0, 3), (25.0, 4), (0.9, 5), (41.0, 6)])
def test_finds_the_known_limit_within_its_tolerance(knee: float, seed: int) -> None:
    spec = ProbeSpec("rate", 0.5, 64.0, tolerance=0.1, repeats=2)
    sim = SimServer(knee, seed)
    s = probe_search(CRIT, spec, sim.measure(spec))
    assert s["stop"] == "tolerance" and s["method"] == "probe"
    met, missed = s["met"], s["missed"]
    # the bracket holds the known limit (the +-3% noise moves the crossing by < 1% of the limit)
    assert met <= sim.limit * 1.01 and missed >= sim.limit * 0.99, (met, missed, sim.limit)
    assert (missed - met) / missed <= 0.1
    assert s["n_probes"] == len(sim.probed) <= probe_bound(spec) == 11
    assert all(len(p["repeats_ms"]) == 2 and p["spread_ms"][0] <= p["spread_ms"][1] for p in s["probes"])
    assert bracket_text(s) == f"[r{met:g} met, r{missed:g} missed]"


def test_tighter_tolerance_costs_more_probes_and_still_holds_the_limit() -> None:
    spec = ProbeSpec("rate", 0.5, 64.0, tolerance=0.02, repeats=3)
    sim = SimServer(10.0, 7, noise=0.01)
    s = probe_search(CRIT, spec, sim.measure(spec))
    assert s["stop"] == "tolerance" and (s["missed"] - s["met"]) / s["missed"] <= 0.02
    assert s["met"] <= sim.limit * 1.005 and s["missed"] >= sim.limit * 0.995
    assert len(sim.probed) <= probe_bound(spec) == 14


def test_top_of_range_stops_and_says_the_limit_is_at_least_the_top() -> None:
    spec = ProbeSpec("rate", 0.5, 6.0, tolerance=0.1, repeats=2)
    sim = SimServer(knee=100.0, seed=3)
    s = probe_search(CRIT, spec, sim.measure(spec))
    assert s["stop"] == "top_of_range" and s["met"] == 6.0 and s["missed"] is None
    assert sim.probed == [0.5, 1.0, 2.0, 4.0, 6.0]  # doubling, capped at the top
    assert bracket_text(s) == "[r6 met, none up to r6 missed]" and not s["bounded"]


def test_never_met_stops_at_the_low_end() -> None:
    spec = ProbeSpec("rate", 2.0, 64.0, tolerance=0.1, repeats=2)
    sim = SimServer(knee=0.5, seed=4)  # already far above 1 s at 2 req/s
    s = probe_search(CRIT, spec, sim.measure(spec))
    assert s["stop"] == "never_met" and s["met"] is None and s["missed"] == 2.0 and sim.probed == [2.0]
    assert bracket_text(s) == "[none (below r2) met, r2 missed]"


def test_over_saturation_is_a_miss_and_ends_the_ascent() -> None:
    # the server finishes at most 5 req/s but its TTFT never rises: only the completion rule can see it
    spec = ProbeSpec("rate", 0.5, 64.0, tolerance=0.1, repeats=2)
    sim = SimServer(knee=1000.0, seed=5, capacity=5.0)
    s = probe_search(CRIT, spec, sim.measure(spec))
    assert s["ascent_stop"].startswith("over-saturated at r8 (completion:")
    assert max(sim.probed) == 8.0  # nothing above the first saturated rate was offered
    assert 4.0 <= s["met"] and s["missed"] <= 8.0 and s["stop"] == "tolerance"
    assert s["met"] <= 5.0 / 0.8 and s["missed"] >= 5.0  # 4 < 5 / 0.8: the 20% margin's blind band
    assert s["saturated"] and all(p["meets"] is False for p in s["probes"] if p["saturated"])


def test_saturation_rules() -> None:
    ok = {"mode": "rate", "rate": 8.0, "achieved_rate": 7.9, "completion_rate": 7.5}
    assert saturation(ok) is None
    # a low achieved rate alone is Poisson noise over few arrivals, not queueing
    assert saturation(dict(ok, achieved_rate=5.0, completion_rate=5.0)) is None
    client = dict(ok, dispatch_lag_ms={"p50": 400.0, "p99": 900.0, "max": 950.0})
    assert (saturation(client) or "").startswith("dispatch: the median request went out 400 ms behind its "
                                                  "schedule, more than the mean gap 125 ms")
    assert saturation(dict(ok, dispatch_lag_ms={"p50": 2.0})) is None
    server = dict(ok, completion_rate=3.0)
    assert (saturation(server) or "").startswith("completion: finished 3/s < 80% of the 7.9/s sent")
    assert saturation({"mode": "concurrency", "concurrency": 4}) is None  # closed loop: not checked
    # over repeats: one saturated repeat is enough
    assert saturation({"mode": "rate", "rate": 8.0, "runs": [ok, server]}) is not None
    assert completion_rate([0.0, 1.0, 2.0, 3.0]) == 1.0 and completion_rate([1.0]) is None


def test_concurrency_search_ends_on_adjacent_levels() -> None:
    spec = ProbeSpec("concurrency", 1, 256, tolerance=0.01, repeats=1)
    sim = SimServer(knee=20.0, seed=6, mode="concurrency")  # limit 24.25: c24 meets, c25 misses
    s = probe_search(CRIT, spec, sim.measure(spec))
    assert (s["met"], s["missed"]) == (24, 25) and "adjacent" in s["stop_text"]
    assert all(isinstance(x, float) and x == int(x) for x in sim.probed)
    assert len(sim.probed) <= probe_bound(spec)
    assert "not checked at concurrency levels" in s["saturation_rule"]


def test_probe_bound_holds_whatever_the_noise() -> None:
    for seed in range(30):
        spec = ProbeSpec("rate", 0.25, 100.0, tolerance=0.05, repeats=1)
        sim = SimServer(knee=random.Random(seed).uniform(0.2, 120), seed=seed, noise=0.3)
        s = probe_search(CRIT, spec, sim.measure(spec))
        assert len(sim.probed) <= probe_bound(spec) and s["stop"] in ("tolerance", "top_of_range", "never_met")


def test_a_probe_without_a_value_misses_and_says_why() -> None:
    o = outcome_from_row(CRIT, {"mode": "rate", "rate": 2.0, "n_ok": 0, "ttft_ms": None}, 2.0)
    assert o.meets is False and o.why == "no ttft figure (no request succeeded)"


@pytest.mark.parametrize("args, msg", [
    (("binary", "1:2", 0.1, 2), "--search-mode 'binary': one of measured, rate, concurrency"),
    (("rate", None, 0.1, 2), "--search-mode rate needs --search-range LOW:HIGH"),
    (("rate", "8:1", 0.1, 2), "--search-range '8:1': LOW and HIGH must be numbers with 0 < LOW < HIGH"),
    (("rate", "a:b", 0.1, 2), "--search-range 'a:b'"),
    (("rate", "1-8", 0.1, 2), "--search-range '1-8': expected LOW:HIGH"),
    (("concurrency", "1.5:8", 0.1, 2), "concurrency levels are whole numbers"),
    (("rate", "1:8", 1.0, 2), "--search-tolerance must be a relative width"),
    (("rate", "1:8", 0.1, 0), "--search-repeats must be from 1 to 10"),
    (("measured", "1:8", 0.1, 2), "--search-range applies to --search-mode rate or concurrency"),
])
def test_probe_spec_refuses_bad_values(args: tuple[Any, ...], msg: str) -> None:
    with pytest.raises(BadInput) as e:
        probe_spec(*args, criterion=CRIT)
    assert msg in str(e.value), str(e.value)


def test_probe_spec_needs_a_criterion_and_names_study_keys() -> None:
    with pytest.raises(BadInput, match=r"\[sweep\] search_mode rate needs \[sweep\] slo_search"):
        probe_spec("rate", "1:8", 0.1, 2, criterion=None, prefix="[sweep] ")
    assert probe_spec("measured", None, 0.1, 2, criterion=None) is None
    assert probe_spec("rate", "0.5:64", 0.1, 2, criterion=CRIT) == ProbeSpec("rate", 0.5, 64.0, 0.1, 2)


def _searched() -> dict[str, Any]:
    spec = ProbeSpec("rate", 0.5, 64.0, tolerance=0.1, repeats=2)
    return probe_search(CRIT, spec, SimServer(7.7, 2).measure(spec))


def test_the_bracket_reaches_the_record_compare_judge_and_narration() -> None:
    from quantrack.measure.sweep import SweepResult
    from quantrack.run.record import _sweep_metrics
    from quantrack.store.records import RunRecord

    s = _searched()
    met, missed = s["met"], s["missed"]
    rec = RunRecord(experiment="x", run_name="a")
    _sweep_metrics(rec, SweepResult("vllm", "http://h", "m", 16, 4, slo_search=s))
    got = {m.key: m.value for m in rec.metrics}
    assert got["sweep_slo_limit"] == met and rec.tags["quantrack.sweep_slo_search_first_miss"] == f"{missed:g}"
    assert rec.tags["quantrack.sweep_slo_search_method"] == "probe"
    assert rec.tags["quantrack.sweep_slo_search_stop"].startswith("tolerance: bracket within the tolerance")

    from quantrack.report.compare import build_table
    from quantrack.report.judge import load_explanation
    from quantrack.store.tracking import RunRow

    row = RunRow(run_id="id-a", experiment_id="1", run_name="a", status="FINISHED", start_time=1, end_time=2,
                 params={}, metrics={"sweep_output_tps_r4": 10.0, "sweep_tpot_ms_p95_r4": 20.0, **got},
                 tags={"quantrack.arm": "a", "quantrack.baseline": "true", **rec.tags})
    t = build_table("x", [row], baseline="a")  # type: ignore[list-item]
    assert t.rows[0]["slo_limit"] == f"[r{met:g} met, r{missed:g} missed] (ttft_p95<=1000ms; probed)"
    expl = load_explanation(row)  # type: ignore[arg-type]
    assert expl[0].startswith(f"SLO search ttft_p95<=1000ms (search result, measured probes): the limit lies in "
                              f"the bracket [r{met:g} met, r{missed:g} missed]; stopped: tolerance")

    from quantrack.arms import Arm
    from quantrack.run.narrate import say_sweep

    lines: list[str] = []
    say_sweep(lines.append, Arm(name="a"), SweepResult("vllm", "http://h", "m", 16, 4, slo_search=s))
    assert lines == [(f"[a] SLO search ttft_p95<=1000ms (measured probes, {s['n_probes']} of at most 11, x2 each): "
                     f"bracket [r{met:g} met, r{missed:g} missed]; stopped: {s['stop_text']}")]


def test_sweep_render_shows_the_bracket_and_every_probe_with_its_spread() -> None:
    from quantrack.cli.sweep import _render_probe_search

    s = _searched()
    text = "\n".join(_render_probe_search(s))
    assert text.startswith(f"SLO search ttft_p95<=1000ms (search result, measured probes): bracket "
                           f"[r{s['met']:g} met, r{s['missed']:g} missed]")
    assert text.count("  probe r") == s["n_probes"] and "(repeats " in text and "misses" in text
    assert "range r0.5-r64, tolerance 0.1, 2 repeats per probe" in text


def test_a_study_with_a_probe_search_records_what_it_asked(tmp_path: Any) -> None:
    from pathlib import Path

    from quantrack.measure.sweep import load_options
    from quantrack.run.outcome import ArmOutcome
    from quantrack.run.record import _params
    from quantrack.store.records import RunRecord
    from quantrack.study import load_study

    text = (Path(__file__).resolve().parents[2] / "examples" / "cpu-smollm2.toml").read_text(encoding="utf-8")
    study_file = tmp_path / "s.toml"
    study_file.write_text(text.replace("concurrency = [1, 2, 4]", 'slo_search = "ttft_p95<=1s"\nsearch_mode = '
                                      '"rate"\nsearch_range = "0.5:4"\nsearch_repeats = 3'), encoding="utf-8")
    study = load_study(study_file)
    assert load_options(study.sweep).probe == ProbeSpec("rate", 0.5, 4.0, 0.1, 3)
    rec = RunRecord(experiment="x", run_name="a")
    _params(rec, study, ArmOutcome(arm=study.arms[0]))
    assert rec.params["sweep_slo_search_probe"] == "rate 0.5:4, tolerance 0.1, x3"


def test_an_interrupted_search_keeps_the_bracket_its_finished_probes_measured() -> None:
    from quantrack.measure.search import SearchTrace, interrupted_result

    spec = ProbeSpec("rate", 0.5, 64.0, tolerance=0.1, repeats=2)
    sim = SimServer(7.7, 2)
    inner = sim.measure(spec)

    def measure(x: float) -> Any:
        if len(sim.probed) == 6:
            raise KeyboardInterrupt
        return inner(x)

    trace = SearchTrace()
    with pytest.raises(KeyboardInterrupt):
        probe_search(CRIT, spec, measure, trace)
    s = interrupted_result(CRIT, spec, trace)
    assert s["stop"] == "interrupted" and s["n_probes"] == 6 and s["met"] == 8.0 and s["missed"] == 16.0
    assert bracket_text(s) == "[r8 met, r16 missed]"
    assert bracket_text(interrupted_result(CRIT, spec, SearchTrace())) == "[none measured met, none measured missed]"
