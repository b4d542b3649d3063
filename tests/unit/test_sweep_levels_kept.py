"""A finished sweep level is never lost (issue #43, "finished work lost" (a)): every level whose requests all came
back is handed on the moment it ends (``run_sweep(on_level=...)``), and an interrupt that lands after a level's last
request came back (its "k/k" line said) but before its row was built still keeps that level. A level cut short is
never made up. Against the local SSE fixture (tests/sse_fixture.py): timing and error paths only."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sse_fixture import FixtureServer

from quantrack.interrupts import Interrupted
from quantrack.measure import sweep as sweep_mod
from quantrack.measure.sweep import SweepResult, run_sweep

SMALL: dict[str, Any] = {"requests_per_level": 4, "input_tokens": 4, "output_tokens": 3, "warmup": 0}


@pytest.fixture(scope="module")
def server() -> Iterator[FixtureServer]:
    srv = FixtureServer(interval_s=0.002).start()
    yield srv
    srv.stop()


def test_each_level_is_handed_on_as_it_ends(server: FixtureServer) -> None:
    seen: list[list[int]] = []

    def on_level(result: SweepResult) -> None:
        seen.append([r["concurrency"] for r in result.rows])

    res = run_sweep(server.base_url + "/ok", "llamacpp", [1, 2, 3], on_level=on_level, **SMALL)
    assert seen == [[1], [1, 2], [1, 2, 3]]
    assert [r["concurrency"] for r in res.rows] == [1, 2, 3] and res.ended_early is None


def _interrupt_when(phase: str, done: int) -> Any:
    def progress(p: str, d: int, _total: int) -> None:
        if p == phase and d == done:
            raise KeyboardInterrupt

    return progress


def test_an_interrupt_right_after_a_levels_last_request_keeps_that_level(server: FixtureServer) -> None:
    """The interrupt lands as the level's 4/4 is said (inside the event loop, before the row is built)."""
    handed: list[int] = []
    with pytest.raises(Interrupted) as exc:
        run_sweep(server.base_url + "/ok", "llamacpp", [1, 2], progress=_interrupt_when("concurrency 1", 4),
                  on_level=lambda r: handed.append(len(r.rows)), **SMALL)
    part = exc.value.partial
    assert isinstance(part, SweepResult) and part.interrupted
    (row,) = part.rows
    assert row["concurrency"] == 1 and row["n_ok"] == 4 and row["output_tok_s"] > 0
    # the level's engine metrics were not scraped to the end: said, never left as if scraped
    assert row["interrupted_after_last_request"] is True and "server_metrics" not in row
    assert handed == [1]


def test_an_interrupt_while_the_row_is_built_keeps_the_level(server: FixtureServer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The interrupt lands after the level's event loop returned, while its row is computed."""
    real = sweep_mod.level_row
    calls = {"n": 0}

    def level_row(*a: Any, **k: Any) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "level_row", level_row)
    with pytest.raises(Interrupted) as exc:
        run_sweep(server.base_url + "/ok", "llamacpp", [2, 3], **SMALL)
    assert [r["concurrency"] for r in exc.value.partial.rows] == [2]
    assert exc.value.partial.rows[0]["n_ok"] == 4


def test_a_level_cut_short_is_not_made_up(server: FixtureServer) -> None:
    with pytest.raises(Interrupted) as exc:
        run_sweep(server.base_url + "/ok", "llamacpp", [1, 2], progress=_interrupt_when("concurrency 2", 2),
                  **SMALL)
    assert [r["concurrency"] for r in exc.value.partial.rows] == [1]


def test_repeats_a_level_is_finished_only_with_its_last_repeat(server: FixtureServer) -> None:
    from quantrack.measure.sweep import LoadOptions

    calls = {"n": 0}

    def progress(p: str, d: int, total: int) -> None:  # the first repeat's 4/4: the level is not finished
        if p == "concurrency 1" and d == total:
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyboardInterrupt

    with pytest.raises(Interrupted) as exc:
        run_sweep(server.base_url + "/ok", "llamacpp", [1], progress=progress, load=LoadOptions(repeats=2), **SMALL)
    assert exc.value.partial.rows == []
    seen = {"n": 0}

    def progress2(p: str, d: int, total: int) -> None:  # the second repeat's 4/4: the level has both
        if p == "concurrency 1" and d == total:
            seen["n"] += 1
            if seen["n"] == 2:
                raise KeyboardInterrupt

    with pytest.raises(Interrupted) as exc2:
        run_sweep(server.base_url + "/ok", "llamacpp", [1, 2], progress=progress2, load=LoadOptions(repeats=2),
                  **SMALL)
    (row,) = exc2.value.partial.rows
    assert row["concurrency"] == 1 and row["repeats"] == 2 and row["n_ok"] == 8


def test_an_error_after_a_level_keeps_the_level_and_says_why_the_sweep_ended(server: FixtureServer,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine gone after level 1 (its /tokenize refused for level 2): level 1 was handed on, and the result
    says the sweep ended early at level c2."""
    from quantrack.errors import MeasurementError

    real = sweep_mod._plan_level
    calls = {"n": 0}

    def plan(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise MeasurementError("llamacpp /tokenize: connection refused")
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "_plan_level", plan)
    kept: list[SweepResult] = []
    with pytest.raises(MeasurementError):
        run_sweep(server.base_url + "/ok", "llamacpp", [1, 2], on_level=kept.append, **SMALL)
    assert [r["concurrency"] for r in kept[-1].rows] == [1]
    assert kept[-1].ended_early == "an error in level c2" and kept[-1].to_dict()["ended_early"] == kept[-1].ended_early
