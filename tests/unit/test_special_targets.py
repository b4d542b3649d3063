"""Issue #43: a writing command never replaces what is not a regular file. A character device or FIFO at an
output path is written through (opened and written, as ``--out /dev/stdout`` users mean); a block device or a
socket is refused; a write error through a device (``/dev/full``: ENOSPC) is one line, exit 2.

The character devices are made with ``mknod`` in the test's folder (the same major/minor as ``/dev/null`` and
``/dev/full``), so a regression replaces a node of the test's, never this machine's ``/dev/null``; one test
writes the real ``/dev/null`` once the helper has been checked on the test's node."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sse_fixture import FixtureServer

from quantrack.cli import main
from quantrack.errors import BadInput
from quantrack.store.files import atomic_write_text, check_writable, special_target, write_atomic


def _chardev(path: Path, minor: int, real: str) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    except (PermissionError, OSError):
        return Path(real)  # without CAP_MKNOD: the machine's own (a non-root user cannot replace it anyway)
    return path


@pytest.fixture
def null(tmp_path: Path) -> Path:
    return _chardev(tmp_path / "null", 3, "/dev/null")


@pytest.fixture
def full(tmp_path: Path) -> Path:
    return _chardev(tmp_path / "full", 7, "/dev/full")


class Fifo:
    """A FIFO in tmp_path with a reader thread that collects everything written into it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # the reader is there before any writer
        os.set_blocking(self.fd, True)
        self.data = b""
        self.stop = threading.Event()
        self.writers_seen = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stop.is_set():
            chunk = os.read(self.fd, 65536)
            if chunk:
                self.data += chunk
                self.writers_seen.set()
            elif self.writers_seen.is_set():
                return  # the writer closed: EOF
            else:
                threading.Event().wait(0.01)  # no writer yet (a FIFO without writers reads as EOF)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        os.close(self.fd)

    def text(self) -> str:
        self.thread.join(timeout=10)
        os.close(self.fd)
        return self.data.decode()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Fifo]:
    f = Fifo(tmp_path / "pipe")
    yield f
    if f.thread.is_alive():
        f.close()


def _still(path: Path, kind: str) -> None:
    mode = os.lstat(path).st_mode
    assert (stat.S_ISCHR(mode) if kind == "chr" else stat.S_ISFIFO(mode)), f"{path} was replaced"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --- the helper ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("writer", [atomic_write_text, write_atomic])
def test_a_character_device_is_written_through_never_replaced(writer, null: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert special_target(null, "--out") == "character device"
    assert writer(null, "page\n", flag="--out") == null
    _still(null, "chr")
    assert _leftovers(tmp_path) == []  # no temp file beside it


@pytest.mark.parametrize("writer", [atomic_write_text, write_atomic])
def test_a_fifo_is_written_through_to_its_reader(writer, fifo: Fifo) -> None:  # type: ignore[no-untyped-def]
    writer(fifo.path, '{"a": 1}\n', flag="--save")
    assert fifo.text() == '{"a": 1}\n'
    _still(fifo.path, "fifo")


def test_a_fifo_nobody_reads_is_refused_at_once_not_a_hang(tmp_path: Path) -> None:
    p = tmp_path / "lonely"
    os.mkfifo(p)
    with pytest.raises(BadInput, match=r"^cannot write --out .*lonely: a FIFO that nobody reads"):
        atomic_write_text(p, "x", flag="--out")
    _still(p, "fifo")


@pytest.mark.parametrize("writer", [atomic_write_text, write_atomic])
def test_a_full_device_is_one_line_exit_2(writer, full: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadInput) as exc:
        writer(full, "x" * 100_000, flag="--out")
    assert str(exc.value) == f"cannot write --out {full} (character device): No space left on device"
    assert exc.value.exit_code == 2
    _still(full, "chr")


def test_the_machine_dev_null_stays_a_device(tmp_path: Path) -> None:
    node = _chardev(tmp_path / "probe-null", 3, "/dev/null")
    if node != Path("/dev/null"):  # checked on the test's own node first: a regression stops here
        atomic_write_text(node, "x")
        _still(node, "chr")
    atomic_write_text("/dev/null", "x", flag="--out")
    write_atomic("/dev/null", b"x", flag="--out")
    _still(Path("/dev/null"), "chr")


def test_a_socket_and_a_folder_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock_path))
        with pytest.raises(BadInput, match=r"s\.sock is a socket: quantrack writes a regular file"):
            atomic_write_text(sock_path, "x", flag="--out")
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    finally:
        s.close()
    with pytest.raises(BadInput, match="is a folder"):
        write_atomic(tmp_path, "x", flag="--out")


def test_a_block_device_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "blk"
    try:
        os.mknod(p, stat.S_IFBLK | 0o600, os.makedev(7, 0))  # loop0's numbers; never opened
    except (PermissionError, OSError):
        pytest.skip("mknod not permitted")
    with pytest.raises(BadInput, match="is a block device"):
        atomic_write_text(p, "x", flag="--save")
    assert stat.S_ISBLK(os.lstat(p).st_mode)


def test_links_only_to_a_device_or_fifo_are_followed(tmp_path: Path, null: Path, fifo: Fifo) -> None:
    to_null = tmp_path / "to-null"
    to_null.symlink_to(null)
    atomic_write_text(to_null, "x", flag="--out")
    assert to_null.is_symlink()
    _still(null, "chr")
    to_fifo = tmp_path / "to-fifo"
    to_fifo.symlink_to(fifo.path)
    write_atomic(to_fifo, "through the link\n", flag="--out")
    assert fifo.text() == "through the link\n"
    precious = tmp_path / "precious"
    precious.write_text("keep\n")
    to_file = tmp_path / "to-file"
    to_file.symlink_to(precious)
    for writer in (atomic_write_text, write_atomic):
        with pytest.raises(BadInput, match="is a symbolic link"):
            writer(to_file, "x", flag="--out")
    assert precious.read_text() == "keep\n" and to_file.is_symlink()


def test_check_writable_accepts_a_device_whose_folder_is_not_writable(null: Path, tmp_path: Path) -> None:
    if null == Path("/dev/null"):
        check_writable(null, "--save")
        return
    tmp_path.chmod(0o500)
    try:
        check_writable(null, "--save")  # the device is written, not its folder
    finally:
        tmp_path.chmod(0o700)
    check_writable("/dev/stdout", "--save")


def test_dev_stdout_is_the_process_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    atomic_write_text("/dev/stdout", "to stdout\n", flag="--out")
    assert capfd.readouterr().out == "to stdout\n"


# --- every writing command ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server() -> Iterator[FixtureServer]:
    srv = FixtureServer(interval_s=0.002).start()
    yield srv
    srv.stop()


def _latency(server: FixtureServer, save: Path) -> list[str]:
    return ["latency", "--engine", "llamacpp", "--base-url", server.base_url + "/ok", "--input-tokens", "4",
            "--output-tokens", "3", "--warmup", "0", "--iterations", "2", "--save", str(save)]


def _sweep(server: FixtureServer, save: Path) -> list[str]:
    return ["sweep", "--engine", "llamacpp", "--base-url", server.base_url + "/ok", "--concurrency", "1",
            "--requests", "2", "--input-len", "4", "--output-len", "3", "--warmup", "0", "--save", str(save)]


def _exit(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.mark.parametrize("command", [_latency, _sweep], ids=["latency --save", "sweep --save"])
def test_measuring_commands_write_through_a_fifo_and_a_device(command, server: FixtureServer, null: Path,  # type: ignore[no-untyped-def]
                                                              full: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    pipe = Fifo(tmp_path / "rows.fifo")
    assert _exit(command(server, pipe.path)) == 0, capsys.readouterr().err
    assert json.loads(pipe.text())["n_ok"] if command is _latency else json.loads(pipe.text())["rows"]
    _still(pipe.path, "fifo")
    capsys.readouterr()
    assert _exit(command(server, null)) == 0
    _still(null, "chr")
    capsys.readouterr()
    assert _exit(command(server, full)) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [(f"quantrack: error: cannot write --save {full} (character device): No space left "
                                 "on device")]
    _still(full, "chr")
    assert _leftovers(tmp_path) == []


def _lm_eval_results(tmp_path: Path) -> Path:
    src = next(Path(__file__).parent.parent.joinpath("data", "eval").rglob("results*.json"), None)
    if src is None:
        pytest.skip("no lm-eval results fixture in tests/data/eval")
    return src


def test_eval_import_out_writes_through(tmp_path: Path, null: Path, full: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    src = _lm_eval_results(tmp_path)
    pipe = Fifo(tmp_path / "import.fifo")
    assert _exit(["eval", "import", str(src), "--out", str(pipe.path)]) == 0, capsys.readouterr().err
    assert json.loads(pipe.text())
    _still(pipe.path, "fifo")
    assert _exit(["eval", "import", str(src), "--out", str(null)]) == 0
    _still(null, "chr")
    capsys.readouterr()
    assert _exit(["eval", "import", str(src), "--out", str(full)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"quantrack: error: cannot write --out {full} (character device): No space left on device"]
    _still(full, "chr")


def test_eval_kl_and_probe_accept_a_device_before_any_request(null: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Their write is the helper's (atomic_write_text); what the command checks first, before a request, must
    not refuse a device for its folder: the run fails on the closed port, not on --out."""
    pipe = Fifo(tmp_path / "kl.fifo")
    for args in (["eval", "kl", "--engine", "llamacpp", "--baseline", "http://127.0.0.1:1",
                  "--candidate", "http://127.0.0.1:1", "--tokens", "8", "--timeout", "2", "--out", str(null)],
                 ["eval", "kl", "--engine", "llamacpp", "--baseline", "http://127.0.0.1:1",
                  "--candidate", "http://127.0.0.1:1", "--tokens", "8", "--timeout", "2", "--out", str(pipe.path)]):
        code = _exit(args)
        err = capsys.readouterr().err
        assert code != 0 and "--out" not in err, err
    _still(null, "chr")
    _still(pipe.path, "fifo")
    pipe.close()


def test_eval_output_records_refuse_a_device_or_fifo(null: Path, fifo: Fifo, capsys: pytest.CaptureFixture[str]) -> None:
    for target, kind in ((null, "character device"), (fifo.path, "FIFO")):
        code = _exit(["eval", "--base-url", "http://127.0.0.1:1", "--output", str(target)])
        assert code == 2
        assert capsys.readouterr().err.splitlines() == [
            (f"quantrack: error: --output {target} is a {kind}: the records file must be a regular file (it is "
             "resumed and its settings are written beside it)")]
    _still(null, "chr")
    _still(fifo.path, "fifo")
