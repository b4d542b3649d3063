"""`quantrack run STUDY --arm X` runs the baseline first (issue #31: it ran X alone although its help said the
baseline still runs, and compare/report then had no baseline). The arms' steps are replaced by a recorder here:
what is tested is which arms run_study runs, in which order, and that each is logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantrack.run import orchestrate
from quantrack.run.orchestrate import RunOptions, run_study
from quantrack.study import load_study

STUDY = Path(__file__).resolve().parents[1] / "data" / "tracking" / "vllm-h200.toml"


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []

    def fake_run_arm(study: Any, arm: Any, opts: Any, workdir: Path, node: Any, progress: Any,
                     baseline: Any = None, out: Any = None) -> Any:
        names.append(arm.name)
        out.status = "FINISHED"
        return out

    monkeypatch.setattr(orchestrate, "run_arm", fake_run_arm)
    return names


@pytest.mark.slow  # a real MLflow store, a study record per arm
def test_one_arm_runs_after_the_baseline(ran: list[str], tmp_path: Path) -> None:
    said: list[str] = []
    result = run_study(load_study(STUDY), RunOptions(arm=("fp8",), workdir=tmp_path), progress=said.append)
    assert ran == ["bf16", "fp8"]
    assert [o.arm.name for o in result.outcomes] == ["bf16", "fp8"]
    assert any("the baseline 'bf16' runs first" in s for s in said)


@pytest.mark.slow
def test_naming_the_baseline_runs_it_once(ran: list[str], tmp_path: Path) -> None:
    run_study(load_study(STUDY), RunOptions(arm=("fp8", "bf16"), workdir=tmp_path), progress=lambda _m: None)
    assert ran == ["bf16", "fp8"]


def test_a_bad_tracking_uri_is_refused_before_any_model_is_fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Seen in a full unit run on an empty cache: `run STUDY --tracking-uri bogus://x` downloaded the model from
    PyPI and requantized three arms (3 min), then said the URI was bad."""
    from quantrack.cli import main

    cache = tmp_path / "cache"
    monkeypatch.setenv("QUANTRACK_CACHE", str(cache))
    example = Path(__file__).resolve().parents[2] / "examples" / "cpu-smollm2.toml"
    with pytest.raises(SystemExit) as exc:
        main(["run", str(example), "--tracking-uri", "bogus://x"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and "--tracking-uri 'bogus://x'" in err
    assert not cache.exists()
