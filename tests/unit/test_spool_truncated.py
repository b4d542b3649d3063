"""Issue #43 (round two's leftovers): a spool entry cut short by a crash or a full disk is one clear line from
``sync`` (which file, that it is truncated, what to do), never "unexpected JSONDecodeError"; and a study whose
``[tracking] uri`` has an unknown scheme is refused by ``preflight`` (at load), not by ``run`` at its end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.store.records import RunRecord
from quantrack.store.tracking import spool_dir, spool_record, spool_terminate

REPO = Path(__file__).resolve().parents[2]


def _exit(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("keep", [0, 1, 40, -2], ids=["empty", "one byte", "mid-string", "last brace gone"])
def test_truncated_record_is_one_clear_line(keep: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = RunRecord(experiment="exp", run_name="arm")
    rec.metric("tpot_ms", 3.5)
    d = spool_record(rec, "http://127.0.0.1:1", "test")
    f = d / "record.json"
    _cut(f, keep if keep >= 0 else len(f.read_bytes()) + keep)
    code = _exit(["sync", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert code == 1
    lines = [ln for ln in err.splitlines() if ln.startswith("quantrack:")]
    assert len(lines) == 1, err
    assert "JSONDecodeError" not in err and "unexpected" not in err
    assert str(f) in lines[0] and ("is empty" in lines[0] or "is cut short" in lines[0])
    assert "inspect and delete it" in lines[0]
    assert f.exists()  # reported, never deleted or skipped in silence


@pytest.mark.parametrize("keep", [0, 5, -1], ids=["empty", "mid-key", "last brace gone"])
def test_truncated_terminate_op_is_one_clear_line(keep: int, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    p = spool_terminate("http://127.0.0.1:1", "exp", "u-123", "KILLED", 1)
    _cut(p, keep if keep >= 0 else len(p.read_bytes()) + keep)
    code = _exit(["sync", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert code == 1 and "JSONDecodeError" not in err and "unexpected" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"quantrack: not synced u-123: unreadable spool entry: {p} ")
    assert lines[0].endswith(": inspect and delete it")
    assert str(p) in err and ("cut short" in err or "is empty" in err)


def test_a_spool_file_that_is_json_but_not_an_entry(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rec = RunRecord(experiment="exp", run_name="arm")
    d = spool_record(rec, "http://127.0.0.1:1", "test")
    (d / "record.json").write_text("[1, 2]")
    assert _exit(["sync", "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 1
    err = capsys.readouterr().err
    assert "holds a JSON list, not a spool entry" in err and "unexpected" not in err
    assert spool_dir() in (d.parent.parent, d.parent.parent.resolve())


@pytest.mark.parametrize("uri", ["bogus://x", "not-a-uri", "http://"])
def test_preflight_refuses_a_bad_tracking_uri_in_the_study(uri: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study.toml"
    shutil.copyfile(REPO / "examples" / "cpu-smollm2.toml", study)
    with study.open("a", encoding="utf-8") as fh:
        fh.write(f'\n[tracking]\nuri = "{uri}"\n')
    assert _exit(["preflight", "--study", str(study)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"quantrack: error: study file {str(study)!r}: [tracking] uri {uri!r}")
