"""ManagedServer on real processes: llama.cpp's server (xllamacpp) on the CPU study's GGUF files,
startup-log parsing of what it printed, clean stops, early-exit and timeout errors."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from quantrack.arms import make_arm
from quantrack.engines import get_adapter
from quantrack.engines.lifecycle import ManagedServer, _stop_all, server_for_arm
from quantrack.errors import EngineError

pytestmark = pytest.mark.integration


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _serve_and_parse(gguf: Path, tmp_path: Path, kv: str = "auto") -> tuple[object, dict]:  # type: ignore[type-arg]
    pytest.importorskip("xllamacpp")
    log = tmp_path / f"{gguf.stem}-{kv}.log"
    srv = server_for_arm("llamacpp", str(gguf), make_arm(f"kv-{kv}", weights="f16", kv=kv), context_len=2048,
                         parallel=1, log_path=log, startup_timeout=120)
    with srv:
        pid = srv.pid
        assert srv.base_url.startswith("http://127.0.0.1:")
        r = httpx.post(f"{srv.base_url}/completion", timeout=60,
                       json={"prompt": "Question: what is 2 + 3?\nAnswer:", "n_predict": 4, "temperature": 0})
        assert r.status_code == 200
        body = r.json()
        assert body["timings"]["predicted_n"] >= 1
        facts = get_adapter("llamacpp").query(srv.base_url).to_dict()
    assert pid is not None and _gone(pid)
    return get_adapter("llamacpp").parse_log_file(log), facts


# file sizes as in ../shared/data/llamacpp-cpu/README.md (same recipe: gguf 0.19.0 requantize of the Q4_1 file)
@pytest.mark.parametrize(("arm", "mib", "bpw"), [("F16", 256.63, 16.00), ("Q8_0", 136.40, 8.51),
                                                 ("Q4_0", 72.27, 4.51)])
def test_requantized_files_load_and_log(gguf_arms: dict[str, Path], tmp_path: Path, arm: str, mib: float,
                                        bpw: float) -> None:
    report, facts = _serve_and_parse(gguf_arms[arm], tmp_path)
    assert report.quantization == arm
    assert (report.extra["file_size_mib"], report.extra["bpw"]) == (mib, bpw)
    assert (report.extra["kv_mib"], report.extra["kv_cells"], report.kv_cache_dtype) == (45.00, 2048, "f16")
    assert facts["slots"] == 1 and facts["n_ctx_slot"] == 2048 and facts["n_ctx_train"] == 8192


def test_q8_kv_cache_is_about_half(gguf_arms: dict[str, Path], tmp_path: Path) -> None:
    f16, _ = _serve_and_parse(gguf_arms["Q8_0"], tmp_path, kv="auto")
    q8, _ = _serve_and_parse(gguf_arms["Q8_0"], tmp_path, kv="q8_0")
    assert q8.extra["flash_attn"] == "enabled" and q8.kv_cache_dtype == "q8_0"
    assert q8.extra["kv_mib"] == 23.91  # same as the shared log for this arm
    # q8_0 stores 34 bytes per 32 values vs 2 bytes per value for f16
    assert q8.extra["kv_mib"] / f16.extra["kv_mib"] == pytest.approx(34 / 64, abs=0.005)


def test_shared_fixture_serves(llamacpp_server: str) -> None:
    health = httpx.get(f"{llamacpp_server}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    facts = get_adapter("llamacpp").query(llamacpp_server).to_dict()
    assert facts["slots"] == 2 and facts["slot_n_ctx"] == 1024  # -c 2048 split over 2 slots


def test_bad_model_exits_early_with_log_lines(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    srv = server_for_arm("llamacpp", str(bad), make_arm("x", weights="f16"), log_path=tmp_path / "bad.log",
                         startup_timeout=60)
    with pytest.raises(EngineError) as err:
        srv.start()
    msg = str(err.value)
    assert "exited with code 1 before it was ready" in msg
    assert "exiting due to model loading error" in msg  # llama.cpp's own line
    assert msg.endswith("quantrack-xllamacpp: error: RuntimeError: Failed to init server, please check the input params.")
    assert srv.pid is not None and _gone(srv.pid)


def test_timeout_and_group_kill(tmp_path: Path) -> None:
    # a "server" that never answers /health and starts a grandchild in its process group
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            " print('grandchild', p.pid, flush=True); time.sleep(60)")
    srv = ManagedServer([sys.executable, "-c", code], port=1, log_path=tmp_path / "slow.log", startup_timeout=1.5,
                        stop_timeout=2)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="did not become healthy"):
        srv.start()
    assert time.monotonic() - t0 < 10
    grandchild = int((tmp_path / "slow.log").read_text().split()[1])
    assert srv.pid is not None and _gone(srv.pid)
    for _ in range(50):  # the grandchild is killed with the group; give the kernel a moment to reap it
        if _gone(grandchild):
            break
        time.sleep(0.1)
    assert _gone(grandchild)


def test_atexit_registry_stops_live_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import weakref

    from quantrack.engines import lifecycle

    # a registry of its own, so the module's shared llama.cpp server is not stopped by this test
    monkeypatch.setattr(lifecycle, "_LIVE", weakref.WeakSet())
    srv = ManagedServer([sys.executable, "-c", "import time; time.sleep(60)"], port=1, log_path=tmp_path / "x.log")
    srv.start(wait=False)
    assert srv.running() and srv in lifecycle._LIVE
    _stop_all()  # what atexit runs
    assert not srv.running() and srv.pid is not None and _gone(srv.pid)


def test_cli_server_info_live(llamacpp_server: str) -> None:
    import json

    from click.testing import CliRunner

    from quantrack.cli import cli

    res = CliRunner().invoke(cli, ["server", "info", "--engine", "llamacpp", "--base-url", llamacpp_server,
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["engine"] == "llamacpp" and info["total_slots"] == 2 and info["n_params"] == 134_515_008
    assert "tokens_predicted_total" in info["metrics"]


def _dead_or_zombie(pid: int) -> bool:
    """Gone, or exited and waiting to be reaped (PID 1 here may never reap orphans)."""
    if _gone(pid):
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_engine_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    """SIGKILL skips atexit and finally: only the parent-death signal (reaper.py) stops the engine."""
    import signal
    import subprocess

    parent_code = (
        "import sys, time\n"
        "from quantrack.engines.lifecycle import ManagedServer\n"
        "srv = ManagedServer([sys.executable, '-c', 'import time; time.sleep(60)'], port=1,\n"
        f"                    log_path={str(tmp_path / 'orphan.log')!r})\n"
        "srv.start(wait=False)\n"
        "print(srv.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.5)  # let the wrapper arm the signal and exec the engine
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert cmdline[:3] == [sys.executable.encode(), b"-c", b"import time; time.sleep(60)"]  # exec'd in place
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while not _dead_or_zombie(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _dead_or_zombie(child), "the engine outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if child and not _dead_or_zombie(child):
            os.killpg(child, signal.SIGKILL)  # the test failed: do not leave the sleeper behind


def test_missing_binary_is_one_clear_error(tmp_path: Path) -> None:
    srv = ManagedServer([str(tmp_path / "no-such-vllm"), "serve"], port=1, log_path=tmp_path / "m.log")
    with pytest.raises(EngineError, match=r"'.*no-such-vllm' not found \(No such file or directory\)"):
        srv.start()
    assert srv.proc is None
    srv = ManagedServer(["quantrack-no-such-engine"], port=1, log_path=tmp_path / "n.log")
    with pytest.raises(EngineError, match=r"'quantrack-no-such-engine' not found"):
        srv.start()


def test_preflight_peeks_the_files_run_resolves(gguf_arms: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """preflight's no-download cache lookup names the same files models_ref.resolve provisions (no drift)."""
    from quantrack.hardware.preflight import cached_model_ref
    from quantrack.models import ref as models_ref

    monkeypatch.setenv("QUANTRACK_CACHE", str(gguf_arms["F16"].parent))  # provisioned by the fixture
    for qtype in models_ref.known_models()["smollm2"].types:
        ref = f"smollm2:{qtype}"
        provisioned = models_ref.resolve(ref).path  # the fixture made the GGUF types; hf-bf16 is exported here
        assert cached_model_ref(ref) == provisioned, ref
