"""Issue #43, round two's leftovers and the smaller items: names that print as another name, an experiment
that is a path, prices files a report cannot use, a read-only or full store, what is not a regular file given to
`logs parse`, `--quick` plus an error, matplotlib's cache warnings. Each case is new for this round."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
STUDY_FILE = DATA / "tracking" / "vllm-h200.toml"
VLLM_RESULT = DATA / "eval" / "vllm-save-results.json"

BASE = """name = "{name}"
[model]
name = "Llama-3-8B"
[gpu]
name = "H200"
[[arms]]
name = "{arm}"
baseline = true
"""


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()


def study(tmp: Path, text: str) -> Path:
    p = tmp / "study.toml"
    p.write_text(text, encoding="utf-8")
    return p


# --- names that show another name ----------------------------------------------------------------------------

HIDDEN = {"right-to-left override": "fp8\u202ekv", "left-to-right override": "\u202dbf16",
          "right-to-left isolate": "kv\u2067x", "zero-width space": "fp8\u200b", "zero-width non-joiner": "a\u200cb",
          "zero-width joiner": "a\u200db", "word joiner": "q4\u20600", "byte-order mark": "\ufeffbf16",
          "right-to-left mark": "x\u200f", "C1 control (NEL)": "a\x85b"}


@pytest.mark.parametrize("case", list(HIDDEN))
def test_hidden_characters_in_names_are_refused(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    """In the study's name and an arm's name (via preflight: one line, exit 2, nothing created)."""
    hidden = HIDDEN[case]
    (char,) = [c for c in hidden if not (c.isascii() and c.isprintable())]
    for name, arm, what in ((hidden, "bf16", ": name "), ("ok", hidden, "arm name ")):
        p = study(tmp_path, BASE.format(name=name, arm=arm))
        code, err = cli(["preflight", "--study", str(p)], capsys)
        assert code == 2 and len(err) == 1, err
        assert what in err[0] and "bidirectional or zero-width" in err[0], err[0]
        assert f"may not hold {char!a}" in err[0]
        assert char not in err[0]  # escaped everywhere in the line: an override cannot turn the line around


def test_ordinary_non_ascii_names_still_pass() -> None:
    from quantrack.names import check_name

    for name in ("qwen-é", "模型-fp8", "ñandú_q4", "kv fp8"):
        assert check_name(name, "arm name") == name


# --- [tracking] experiment -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("experiment", "why"), [
    ("../../x", "a '.' or '..' segment is a path"), ("runs/../../etc", "a '.' or '..' segment is a path"),
    ("..", "a '.' or '..' segment is a path"), ("a/./b", "a '.' or '..' segment is a path"),
    ("x\\\\..\\\\y", "may not hold '\\\\'"), ("exp\u202e", "may not hold '\\u202e'"),
    ("exp\u200b", "may not hold '\\u200b'"), ("e" * 251, "at most 250"),
])
def test_log_refuses_an_experiment_that_is_a_path(tmp_path: Path, experiment: str, why: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = STUDY_FILE.read_text(encoding="utf-8") + f'\n[tracking]\nexperiment = "{experiment}"\n'
    p = study(tmp_path, text)
    store = tmp_path / "store"
    code, err = cli(["log", "--study", str(p), "--arm", "bf16", "--eval", str(VLLM_RESULT),
                     "--tracking-uri", f"sqlite:///{store}/mlflow.db"], capsys)
    assert code == 2 and len(err) == 1 and "[tracking] experiment" in err[0] and why in err[0], err
    assert not store.exists()


def test_a_databricks_style_experiment_path_is_still_a_name() -> None:
    from quantrack.names import check_experiment

    assert check_experiment("/Users/me@example.com/quant-study") == "/Users/me@example.com/quant-study"


# --- prices ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "want"), [
    (None, "file not found"),
    (lambda p: p.write_text("[[price]\n"), "is not valid TOML"),
    (lambda p: p.write_text('[[price]]\ngpu = "H200"\n'), "missing 'usd_per_hour'"),
    (lambda p: p.write_text("title = 1\n"), "needs at least one [[price]] table"),
    (lambda p: p.mkdir(), "is not a regular file (a folder)"),
    (os.mkfifo, "is not a regular file (a FIFO)"),
    (lambda p: p.symlink_to("/dev/zero"), "is not a regular file (a character device)"),
    (lambda p: p.write_bytes(b"\xff\xfe[[price]]"), "is not valid TOML"),
])
def test_preflight_refuses_a_prices_file_the_report_cannot_use(tmp_path: Path, make: object, want: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    prices = tmp_path / "p.toml"
    if make is not None:
        make(prices)  # type: ignore[operator]
    p = study(tmp_path, BASE.format(name="s", arm="bf16") + '[decision]\nprices = "p.toml"\n')
    code, err = cli(["preflight", "--study", str(p)], capsys)
    assert code == 2 and len(err) == 1, err
    assert "[decision] prices" in err[0] and want in err[0]


def _store_with_logged_study(tmp: Path, decision: str) -> str:
    from quantrack.store.records import RunRecord
    from quantrack.store.tracking import Tracker

    uri = f"sqlite:///{tmp}/mlflow.db"
    tracker = Tracker(uri, "priced")
    parent = RunRecord(experiment="priced", run_name="study:s", status="RUNNING")
    parent.tag("quantrack.role", "study")
    parent.artifacts["study/study.toml"] = BASE.format(name="s", arm="bf16") + decision
    p = tracker.log(parent)
    arm = RunRecord(experiment="priced", run_name="bf16", parent_uuid=p.uuid)
    arm.tag("quantrack.role", "arm")
    arm.tag("quantrack.arm", "bf16")
    arm.metric("sweep_output_tps_c1", 200.0)
    tracker.log(arm)
    tracker.finish(p, "FINISHED")
    return uri


@pytest.mark.slow  # a real MLflow store
def test_report_on_a_logged_study_with_relative_prices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The logged study names prices = "p.toml": the store keeps the text, not where the file lay. From another
    folder holding a p.toml of its own the report must not read that one: it says what to give; with --study the
    path is read relative to the study file, wherever the command runs."""
    from quantrack.constraints import Constraints
    from quantrack.hardware.pricing import default_prices_path
    from quantrack.report.decision import decision_report

    uri = _store_with_logged_study(tmp_path, '[decision]\nprices = "p.toml"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "p.toml").write_text(default_prices_path().read_text())
    monkeypatch.chdir(elsewhere)
    with pytest.raises(BadInput, match=r"names \[decision\] prices = 'p.toml', a path relative to that file.*"
                                       r"give --study FILE .* or --prices FILE"):
        decision_report("priced", Constraints(), uri=uri)
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "p.toml").write_text(default_prices_path().read_text())
    sfile = studies / "s.toml"
    sfile.write_text(BASE.format(name="s", arm="bf16") + '[decision]\nprices = "p.toml"\n')
    rep = decision_report("priced", Constraints(), uri=uri, study=os.path.relpath(sfile, elsewhere))
    assert rep.constraints.prices == str(studies / "p.toml") or \
        Path(rep.constraints.prices or "").resolve() == (studies / "p.toml").resolve()
    rep = decision_report("priced", Constraints(prices=str(default_prices_path())), uri=uri)
    assert rep.constraints.prices == str(default_prices_path())


# --- a store that cannot write -----------------------------------------------------------------------------------

def test_storage_reason_names_the_disk_not_the_autoflush(tmp_path: Path) -> None:
    """A real sqlite3 refusal (a read-only database) wrapped as MLflow wraps it: the innermost words are kept."""
    from quantrack.store.tracking import storage_reason

    db = tmp_path / "x.db"
    sqlite3.connect(db).execute("create table t (x)").connection.commit()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        con.execute("insert into t values (1)")
    except sqlite3.OperationalError as inner:
        try:
            raise RuntimeError("(raised as a result of Query-invoked autoflush; consider using a session."
                               "no_autoflush block if this flush is occurring prematurely)") from inner
        except RuntimeError as outer:
            assert storage_reason(outer) == "attempt to write a readonly database"
    assert storage_reason(OSError(28, "No space left on device")) == "No space left on device"
    assert storage_reason(ValueError("no such experiment")) is None


def _chattr(flag: str, path: Path) -> bool:
    exe = shutil.which("chattr")
    return exe is not None and subprocess.run([exe, flag, str(path)], capture_output=True, check=False).returncode == 0


@pytest.mark.slow  # a real MLflow store, twice
def test_a_read_only_store_is_one_line_and_the_run_is_spooled(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's database made immutable (chattr +i: read-only even to root): `log` spools the arm and says why
    in one line (was ~90 lines of SQLAlchemy traceback)."""
    store = tmp_path / "store"
    uri = f"sqlite:///{store}/mlflow.db"
    spool = tmp_path / "spool"
    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(spool))
    assert cli(["log", "--study", str(STUDY_FILE), "--arm", "bf16", "--eval", str(VLLM_RESULT), "--tracking-uri",
                uri], capsys)[0] == 0
    if not _chattr("+i", store / "mlflow.db"):
        pytest.skip("chattr +i is not allowed here (needs CAP_LINUX_IMMUTABLE)")
    try:
        code, err = cli(["log", "--study", str(STUDY_FILE), "--arm", "fp8", "--eval", str(VLLM_RESULT),
                         "--tracking-uri", uri], capsys)
    finally:
        _chattr("-i", store / "mlflow.db")
    assert code == 0
    assert len(err) == 1, err
    # sqlite says either, depending on which file it touches first (the database or its journal)
    assert ("could not write: attempt to write a readonly database" in err[0]
            or "could not write: disk i/o error" in err[0]) and "spooled run 'fp8'" in err[0], err[0]
    assert len(list((spool / "pending").iterdir())) == 1


# --- what is not a regular file, given to `logs parse` -------------------------------------------------------------

@pytest.mark.parametrize(("make", "want"), [
    (os.mkfifo, "is not a regular file (a FIFO), not a log file"),
    (lambda p: p.symlink_to("/dev/zero"), "is not a regular file (a character device), not a log file"),
    (lambda p: p.symlink_to("/dev/null"), "is not a regular file (a character device), not a log file"),
    (lambda p: p.symlink_to(p.parent / "gone.log"), "log file not found"),
    (None, "log file not found"),
])
def test_logs_parse_names_what_is_not_a_log(tmp_path: Path, make: object, want: str) -> None:
    """A subprocess: a FIFO read would block the command for ever (it did: 'file not found' was the lucky case)."""
    p = tmp_path / "server.log"
    if make is not None:
        make(p)  # type: ignore[operator]
    r = subprocess.run([sys.executable, "-m", "quantrack.cli", "logs", "parse", str(p)], capture_output=True,
                       text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and want in r.stderr, r.stderr


# --- --quick plus an error, matplotlib's warnings ------------------------------------------------------------------

def test_quick_with_an_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = study(tmp_path, BASE.format(name="s", arm="bf16"))
    code, err = cli(["run", "--quick", str(p), "--ray", "auto", "--arm", "bf16"], capsys)
    assert code == 2 and len(err) == 1 and "--ray runs every" in err[0], err


def test_matplotlib_warnings_stay_off_stderr(tmp_path: Path) -> None:
    """A home whose config folder cannot be made (/proc/1 holds no .config): matplotlib warned on stderr at every
    draw; quantrack points MPLCONFIGDIR at its cache folder (here $QUANTRACK_CACHE) first."""
    code = ("from quantrack.report.figures import _subplots, _png\n"
            "fig, ax = _subplots((2, 2)); ax.plot([1, 2], [3, 4]); assert _png(fig)[:4] == b'\\x89PNG'\n"
            "import os; print(os.environ['MPLCONFIGDIR'])")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    env.update(HOME="/proc/1", QUANTRACK_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.strip() == str(tmp_path / "cache" / "matplotlib")


# --- a full work folder ------------------------------------------------------------------------------------------

@pytest.fixture
def full_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real 256 KiB tmpfs filled to the last block (needs mount rights: root in this container; else skipped)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    mount, umount = shutil.which("mount"), shutil.which("umount")
    if not (mount and umount) or subprocess.run([mount, "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                                                capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with open(mnt / "fill", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
        yield mnt
    finally:
        subprocess.run([umount, str(mnt)], capture_output=True, check=False)


def test_a_full_work_folder_names_the_disk_not_an_empty_log(full_disk: Path) -> None:
    from quantrack.engines.lifecycle import ManagedServer, disk_full_note
    from quantrack.errors import EngineError

    srv = ManagedServer([sys.executable, "-c", "print('up')"], port=9, log_path=full_disk / "arm-server.log",
                        name="llama.cpp", startup_timeout=5)
    with pytest.raises(EngineError) as exc:
        srv.start()
    msg = str(exc.value)
    assert f"cannot start llama.cpp: no space left on the disk holding {full_disk}" in msg
    assert "(empty log)" not in msg and not srv.running()
    assert disk_full_note(full_disk.parent) is None  # the test's own folder has room
