"""The code sandbox (quantrack.accuracy.sandbox) on HumanEval's canonical solutions and on hostile programs.

Every hostile program must score as a failure, end within its limit, and leave the machine as it was: nothing new in
/tmp, /var/tmp, /dev/shm or $HOME, the victim file still there, no process left. Programs run with the Python guard
(the product) and, where it is safe on a shared machine, without it, to show what the OS-level limits contain alone.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quantrack.accuracy.humaneval import NUM_PROBLEMS, check_program, extract_code, load_problems
from quantrack.accuracy.sandbox import Limits, Outcome, isolation, run_python

REPO = Path(__file__).resolve().parents[2]
WATCHED = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path.home()]
LIMIT = Limits(timeout_s=2.0)


def _listing() -> dict[Path, set[str]]:
    return {d: set(os.listdir(d)) for d in WATCHED if d.is_dir()}


@pytest.fixture
def untouched() -> Iterator[Path]:
    """A victim directory outside /tmp (in the checkout) with one file; afterwards: the file is intact and no
    watched directory gained an entry that mentions the sandbox's names."""
    victim_dir = Path(tempfile.mkdtemp(prefix=".sandbox-victim-", dir=REPO))
    (victim_dir / "keep.txt").write_text("keep")
    before = _listing()
    yield victim_dir
    after = _listing()
    for d, names in after.items():
        new = {n for n in names - before.get(d, set()) if "qt-evil" in n or n.startswith("quantrack-sandbox-")}
        assert not new, f"left behind in {d}: {sorted(new)}"
    assert (victim_dir / "keep.txt").read_text() == "keep"
    assert sorted(os.listdir(victim_dir)) == ["keep.txt"]
    (victim_dir / "keep.txt").unlink()
    victim_dir.rmdir()


def _problems() -> list[dict]:
    problems, _ = load_problems()
    assert len(problems) == NUM_PROBLEMS
    return problems


def _canonical(problem: dict) -> Outcome:
    code = extract_code(problem["canonical_solution"], problem["prompt"], problem["entry_point"])
    return run_python(check_program(code, problem["test"], problem["entry_point"]))


def test_ten_canonical_solutions_pass_and_empty_answers_fail() -> None:
    problems = _problems()[:10]
    with ThreadPoolExecutor(4) as pool:
        good = list(pool.map(_canonical, problems))
        empty = list(pool.map(lambda p: run_python(check_program(extract_code("", p["prompt"], p["entry_point"]),
                                                                 p["test"], p["entry_point"])), problems))
    assert [o.status for o in good] == ["passed"] * 10, [o.detail for o in good]
    assert sum(o.passed for o in empty) == 0


@pytest.mark.slow
def test_all_164_canonical_solutions_pass() -> None:
    problems = _problems()
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(_canonical, problems))
    failed = [(p["task_id"], o.detail) for p, o in zip(problems, outs) if not o.passed]
    print(f"164 canonical solutions in {time.monotonic() - t0:.1f} s, 4 workers, isolation {isolation()}")
    assert failed == [] and sum(o.passed for o in outs) == 164


def test_chat_answer_in_a_fence_is_extracted() -> None:
    p = _problems()[0]
    answer = ("Here you go:\n```python\nfrom typing import List\n\ndef has_close_elements(numbers: List[float], "
              "threshold: float) -> bool:\n" + p["canonical_solution"] + "```\nDone.")
    assert run_python(check_program(extract_code(answer, p["prompt"], p["entry_point"]), p["test"],
                                    p["entry_point"])).passed


def _hostile(program: str, guard: bool, limits: Limits = LIMIT) -> Outcome:
    t0 = time.monotonic()
    out = run_python(program, limits, guard=guard)
    took = time.monotonic() - t0
    assert not out.passed, out
    assert took < limits.timeout_s + 3.0, f"took {took:.1f} s"
    return out


@pytest.mark.parametrize("guard", [True, False])
def test_infinite_loop_is_killed_within_its_limit(guard: bool, untouched: Path) -> None:
    out = _hostile("while True:\n    pass\n", guard)
    assert out.status in ("timeout", "failed")  # wall clock or RLIMIT_CPU (SIGXCPU), whichever first


@pytest.mark.parametrize("guard", [True, False])
def test_ten_gigabyte_allocation_fails(guard: bool, untouched: Path) -> None:
    out = _hostile("x = bytearray(10 * 1024 ** 3)\nassert len(x) > 0\n", guard)
    assert "MemoryError" in out.detail


def test_fork_loop_is_refused(untouched: Path) -> None:
    out = _hostile("import os\nwhile True:\n    os.fork()\n", True)
    assert "PermissionError" in out.detail


@pytest.mark.skipif(isolation() != "namespaces", reason="needs the mount namespace to find escaped children")
def test_children_that_leave_the_process_group_are_killed(untouched: Path) -> None:
    # without the guard: 5 children call setsid (leaving the group) and sleep; the parent reports their pids and
    # fails. They must all be gone when run_python returns.
    program = ("import os, sys, time\npids = []\nfor _ in range(5):\n    pid = os.fork()\n    if pid == 0:\n"
               "        os.setsid(); time.sleep(60); os._exit(0)\n    pids.append(pid)\n"
               "sys.stderr.write('PIDS ' + ' '.join(map(str, pids)) + '\\n'); sys.exit(3)\n")
    out = _hostile(program, False)
    pids = [int(x) for x in out.detail.split()[1:]]
    assert len(pids) == 5
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if state != "Z" and b"runner.py" in cmd:
                alive.append(pid)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    assert alive == []


@pytest.mark.parametrize("guard", [True, False])
def test_writes_to_home_and_tmp_land_nowhere(guard: bool, untouched: Path) -> None:
    home = Path.home()
    if not guard and isolation() != "namespaces":
        pytest.skip("without namespaces only the guard keeps writes in")
    program = (f"import os\nfor p in ({str(home / 'qt-evil-home')!r}, '/tmp/qt-evil-tmp', '/var/tmp/qt-evil-var',"
               f" '/dev/shm/qt-evil-shm', os.path.expanduser('~/qt-evil-tilde'), {str(untouched / 'qt-evil')!r}):\n"
               "    try:\n        open(p, 'w').write('x')\n    except OSError:\n        pass\n"
               "raise SystemExit(1)\n")
    _hostile(program, guard)
    for p in (home / "qt-evil-home", Path("/tmp/qt-evil-tmp"), Path("/var/tmp/qt-evil-var"),
              Path("/dev/shm/qt-evil-shm"), untouched / "qt-evil"):
        assert not p.exists(), p


@pytest.mark.parametrize("guard", [True, False])
def test_socket_to_localhost_fails(guard: bool, untouched: Path) -> None:
    if not guard and isolation() != "namespaces":
        pytest.skip("without namespaces only the guard blocks sockets")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    try:
        out = _hostile(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), 1)\ns.sendall(b'x')\n",
                       guard)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing reached the listener
    finally:
        listener.close()
    assert ("PermissionError" in out.detail) if guard else ("OSError" in out.detail or "Error" in out.detail)


def test_os_system_is_refused(untouched: Path) -> None:
    out = _hostile(f"import os\nassert os.system('touch {untouched / 'qt-evil-system'}') == 0\n", True)
    assert "PermissionError" in out.detail


@pytest.mark.skipif(isolation() != "namespaces", reason="without namespaces only the guard stops os.system")
def test_os_system_without_the_guard_cannot_write_outside(untouched: Path) -> None:
    _hostile(f"import os\nassert os.system('touch {untouched / 'qt-evil-system'} {Path.home() / 'qt-evil-s'}') == 0\n",
             False)
    assert not (Path.home() / "qt-evil-s").exists()


@pytest.mark.parametrize("guard", [True, False])
def test_deleting_files_fails(guard: bool, untouched: Path) -> None:
    if not guard and isolation() != "namespaces":
        pytest.skip("without namespaces only the guard stops deletion")
    victim = untouched / "keep.txt"
    _hostile(f"import os, shutil\nos.remove({str(victim)!r})\nshutil.rmtree({str(untouched)!r})\n", guard)
    assert victim.read_text() == "keep"


@pytest.mark.skipif(isolation() != "namespaces", reason="without namespaces /tmp is the real /tmp")
def test_scratch_dir_is_writable_and_removed(untouched: Path) -> None:
    out = run_python("import os\nopen('here.txt', 'w').write('ok')\nopen('/tmp/qt-evil-scratch', 'w').write('ok')\n"
                     "assert open('here.txt').read() == 'ok'\n", LIMIT)
    assert out.passed, out
    assert not Path("/tmp/qt-evil-scratch").exists()


@pytest.mark.parametrize("body", [
    "    while True:\n        pass\n",
    "    import os\n    while True:\n        os.fork()\n",
    "    x = bytearray(10 * 1024 ** 3)\n    return True\n",
    "    open(__import__('os').path.expanduser('~/qt-evil-he'), 'w').write('x')\n    return True\n",
    "    import socket\n    socket.create_connection(('127.0.0.1', 9), 1)\n    return True\n",
    "    import os\n    os.system('touch /tmp/qt-evil-he-system')\n    return True\n",
    "    import shutil\n    shutil.rmtree('/tmp')\n    return True\n",
], ids=["loop", "fork", "10GB", "home", "socket", "system", "rmtree"])
def test_hostile_humaneval_completions_score_as_failures(body: str, untouched: Path) -> None:
    """The product path: a completion of HumanEval/0 scored by the `code` scorer (guard on, 2 s limit)."""
    from quantrack.accuracy.scorers import get_scorer

    p = _problems()[0]
    item = {"prompt": p["prompt"], "reference": p["test"], "entry_point": p["entry_point"]}
    t0 = time.monotonic()
    verdict = get_scorer("code", code_timeout_s=2.0)(body, item)
    assert not verdict.correct and verdict.extra["sandbox"] in ("failed", "timeout"), verdict
    assert time.monotonic() - t0 < 5.0
    assert not (Path.home() / "qt-evil-he").exists() and not Path("/tmp/qt-evil-he-system").exists()
