"""Measurement hygiene: the contention figure from CPU readings (pure), and a real CPU burner flagged."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from quantrack.measure.hygiene import (
    CpuTimes,
    Hygiene,
    Limits,
    cv,
    sampling,
    summarize_cpu,
)


def _t(wall: float, busy: float, watched: float, load1: float = 0.5, steal: float = 0.0) -> CpuTimes:
    return CpuTimes(wall=wall, busy=busy, steal=steal, total=wall * 2, watched=watched, load1=load1)


def test_others_cpu_is_busy_minus_watched_per_second() -> None:
    # 10 s of wall time; 14 CPU-s busy on the host, 9 of them the engine + quantrack: others used 0.5 cores.
    h = summarize_cpu("latency", [_t(0, 100, 50), _t(5, 107, 55, load1=1.9), _t(10, 114, 59)], cores=2)
    assert h.others_cpu_cores == pytest.approx(0.5)
    assert h.load1_max == 1.9
    assert h.contended is False  # 0.5 is the limit, not above it
    assert h.flag() == ""


def test_two_busy_neighbours_are_flagged_with_the_load() -> None:
    h = summarize_cpu("sweep", [_t(0, 0, 0, load1=4.1), _t(10, 20, 4, load1=7.2)], cores=2)
    assert h.others_cpu_cores == pytest.approx(1.6)
    assert h.reasons == ["other processes used 1.6 of 2 cores", "host load 7.2 on 2 cores"]
    assert h.flag() == "⚠ other processes used 1.6 of 2 cores"
    assert h.tags() == {"quantrack.sweep_contention": "yes",
                        "quantrack.sweep_contention_reasons": "other processes used 1.6 of 2 cores; "
                                                              "host load 7.2 on 2 cores"}
    assert h.metrics()["sweep_host_others_cpu_cores"] == pytest.approx(1.6)


def test_steal_and_gpu_reasons() -> None:
    h = summarize_cpu("latency", [_t(0, 0, 0), CpuTimes(10, 1, 3, 20, 1, 0.1)], cores=2)
    assert h.steal_pct == pytest.approx(15.0)
    h.gpu_throttle = ["thermal (hardware)"]
    h.gpu_other_processes = 2
    assert h.reasons == ["CPU steal 15%", "GPU clocks throttled: thermal (hardware)", "2 other process(es) on the GPU"]


def test_nothing_sampled_is_unknown_never_clean() -> None:
    h = Hygiene(step="latency", cores=2)
    assert h.contended is None
    assert h.flag() == "? contention not sampled"
    assert h.tags()["quantrack.latency_contention"] == "unknown"


def test_limits_are_the_stated_ones() -> None:
    lim = Limits()
    assert (lim.others_cpu_cores, lim.steal_pct, lim.load_per_core) == (0.5, 5.0, 2.0)
    h = summarize_cpu("latency", [_t(0, 0, 0), _t(10, 4, 0)], cores=2, limits=Limits(others_cpu_cores=0.3))
    assert h.contended is True


def test_cv() -> None:
    assert cv([1.0]) is None
    assert cv([2.0, 2.0, 2.0]) == 0.0
    assert cv([1.0, 3.0]) == pytest.approx((2 ** 0.5) / 2)


@pytest.mark.timing  # two CPU burners; a contention threshold
def test_real_cpu_burners_are_flagged() -> None:
    """Two CPU-bound processes beside the sampler: the others' figure counts them (≥ 0.5 of a core)."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        with sampling("latency", interval=0.2) as s:
            time.sleep(2.0)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    h = s.result
    assert h is not None and h.samples >= 3
    assert h.contended is True
    assert h.others_cpu_cores is not None and h.others_cpu_cores > 0.5


@pytest.mark.timing  # a CPU burner as the engine
def test_engine_tree_is_not_counted_as_others() -> None:
    """A busy 'engine' process watched by pid counts as the engine, not as contention."""
    eng = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with sampling("latency", engine_pid=eng.pid, interval=0.2) as s:
            time.sleep(2.0)
    finally:
        eng.kill()
        eng.wait()
    h = s.result
    assert h is not None and h.engine_cpu_cores is not None
    # the engine's own loop is measured as the engine (on a quiet machine ~1 core; under load less, never 0)
    assert h.engine_cpu_cores > 0.05


def test_tag_names_are_the_record_schemas() -> None:
    """The writer (hygiene.tags) and the readers (compare, report) use the names in quantrack.run.schema."""
    from quantrack.run.schema import Tag

    tags = summarize_cpu("sweep", [_t(0, 0, 0), _t(10, 20, 4)], cores=2).tags()
    assert set(tags) == {Tag.CONTENTION.format(step="sweep"), Tag.CONTENTION_REASONS.format(step="sweep")}
