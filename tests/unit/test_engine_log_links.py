"""Issue #43: an engine's log is never written through a symbolic link — not one given as ``serve --log``, not
one planted in the work folder of ``run`` (refused before any engine starts, one line, exit 2), and not one
planted after every check (the log is opened ``O_NOFOLLOW``: the start is refused, nothing runs). An engine log
must be a regular file (it is tailed and parsed afterwards): a FIFO there is refused too."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.engines.lifecycle import ManagedServer
from quantrack.errors import BadInput

REPO = Path(__file__).resolve().parents[2]
CPU_STUDY = REPO / "examples" / "cpu-smollm2.toml"


def _exit(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture
def precious(tmp_path: Path) -> Path:
    p = tmp_path / "precious.txt"
    p.write_text("keep me\n")
    return p


def _serve(log: Path, tmp_path: Path) -> list[str]:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return ["serve", "--engine", "llamacpp", "--model", str(model), "--arm", "f16", "--log", str(log), "--dry-run"]


def test_serve_log_that_is_a_link_is_refused(tmp_path: Path, precious: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "server.log"
    link.symlink_to(precious)
    assert _exit(_serve(link, tmp_path)) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [(f"quantrack: error: --log {link} is a symbolic link (to {precious}): give the "
                                    "file itself; quantrack never writes through a link")]
    assert "command:" not in out.out  # refused before anything
    assert precious.read_text() == "keep me\n" and link.is_symlink()


def test_serve_log_dangling_link_and_fifo_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dangling = tmp_path / "dangling.log"
    dangling.symlink_to(tmp_path / "nowhere" / "x.log")
    assert _exit(_serve(dangling, tmp_path)) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    assert _exit(_serve(fifo, tmp_path)) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"quantrack: error: --log {fifo} is a FIFO: it must be a regular file (the engine's log is parsed)"]


def test_serve_log_regular_file_still_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "ok.log"
    assert _exit(_serve(log, tmp_path)) == 0
    assert "command:" in capsys.readouterr().out


def test_a_link_planted_after_the_checks_is_refused_at_open(tmp_path: Path, precious: Path) -> None:
    log = tmp_path / "late.log"
    srv = ManagedServer([sys.executable, "-c", "import time; time.sleep(30)"], port=1, log_path=log,
                        die_with_parent=False)
    log.symlink_to(precious)  # planted between construction and start
    with pytest.raises(BadInput, match="is a symbolic link"):
        srv.start(wait=False)
    assert srv.proc is None  # nothing was started
    assert precious.read_text() == "keep me\n"


def test_run_refuses_a_link_planted_in_the_work_dir_before_any_engine(tmp_path: Path, precious: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study.toml"
    shutil.copyfile(CPU_STUDY, study)
    work = tmp_path / "work"
    work.mkdir()
    planted = work / "Q8_0-server.log"
    planted.symlink_to(precious)
    code = _exit(["run", str(study), "--workdir", str(work), "--tracking-uri",
                  f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"])
    assert code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [(f"quantrack: error: {planted} is a symbolic link (to {precious}): give the file itself; "
                   "quantrack never writes through a link")]
    assert precious.read_text() == "keep me\n"
    assert sorted(p.name for p in work.iterdir()) == ["Q8_0-server.log"]  # no engine log, nothing started
