"""Files whole or not at all, a private spool that reports partial entries, bounded timeouts, URIs refused
early, and secrets redacted by value (URL passwords, env values, argv inside lists) with JSON kept valid.

The disk-full paths here are simulated at the syscall (``os.fsync`` raising ENOSPC) so they are exact and
fast; tests/integration/test_faults_real.py repeats them on a real full tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from quantrack.errors import BadInput
from quantrack.measure.client import check_timeout, http_timeout
from quantrack.redact import (
    REDACTED,
    RedactingStream,
    forget_secrets,
    known_secrets,
    redact_argv,
    redact_env,
    redact_text,
    register_secret,
)
from quantrack.store.files import DiskError, atomic_write_text
from quantrack.store.records import RunRecord
from quantrack.store.tracking import Tracker, partial_spool, pending_spool, spool_dir, spool_record, sync_spool
from quantrack.store.uri import resolve_uri

KEY = "sk-planted-" + "a1b2c3d4e5f6a7b8"
PROXY_PASS = "pr0xy-Pa55-" + "x9"


@pytest.fixture(autouse=True)
def _forget() -> None:
    forget_secrets()


def _enospc(*_a: object, **_k: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


# --- atomic files ---------------------------------------------------------------------------------------------

def test_atomic_write_replaces_whole(tmp_path: Path) -> None:
    p = tmp_path / "row.json"
    atomic_write_text(p, "old\n")
    atomic_write_text(p, "new\n")
    assert p.read_text() == "new\n" and [x.name for x in tmp_path.iterdir()] == ["row.json"]


def test_atomic_write_full_disk_keeps_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "row.json"
    p.write_text("measured before\n")
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(DiskError) as exc:
        atomic_write_text(p, "x" * 10_000, flag="--save")
    assert str(exc.value) == f"no space left on device writing --save {p}"
    assert p.read_text() == "measured before\n" and [x.name for x in tmp_path.iterdir()] == ["row.json"]


def test_atomic_write_missing_folder_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="the folder .*nope does not exist"):
        atomic_write_text(tmp_path / "nope" / "x.json", "{}", flag="--out")
    assert not (tmp_path / "nope").exists()


def test_latency_save_full_disk_leaves_no_zero_byte_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantrack.cli.latency import _save

    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(DiskError, match="no space left on device writing --save"):
        _save(tmp_path / "bf16.json", {"label": "bf16"})
    assert list(tmp_path.iterdir()) == []


# --- the spool ------------------------------------------------------------------------------------------------

def _record(name: str = "arm") -> RunRecord:
    rec = RunRecord(experiment="exp", run_name=name)
    rec.metric("tpot_ms", 3.5)
    rec.artifacts["notes.txt"] = "hello\n"
    return rec


def test_spool_is_private(tmp_path: Path) -> None:
    d = spool_record(_record(), "http://127.0.0.1:1", "test")
    for p in [spool_dir(), spool_dir() / "pending", d, *d.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), f"{p}: {oct(mode)}"


def test_spool_full_disk_one_line_no_partial_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(DiskError) as exc:
        spool_record(_record("fp8"), "http://127.0.0.1:1", "server down")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("could not spool run 'fp8' (server down): no space left on device")
    assert str(spool_dir() / "pending") in msg
    assert pending_spool() == [] and partial_spool() == []


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_sync_reports_partial_entries(tmp_path: Path) -> None:
    good = spool_record(_record(), "sqlite:///" + str(tmp_path / "s.db"), "test")
    torn = spool_dir() / "pending" / ".0123abcd.tmp"
    (torn / "artifacts").mkdir(parents=True)
    (torn / "artifacts" / "server.log").write_text("half\n")
    no_record = spool_dir() / "pending" / "feedbeef"
    no_record.mkdir()
    res = sync_spool()
    reasons = dict(res.failed)
    assert set(reasons) == {"0123abcd", "feedbeef"}
    assert all("partial spool entry" in r for r in reasons.values())
    assert res.uploaded == [good.name]


def test_spooled_status_update_is_atomic(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantrack.store.tracking import _update_spooled_status

    d = spool_record(_record(), "http://127.0.0.1:1", "test")
    before = (d / "record.json").read_text()
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(DiskError):
        _update_spooled_status(d.name, "KILLED", 1)
    assert (d / "record.json").read_text() == before  # never a truncated record.json


@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_local_store_full_disk_spools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local store whose disk is full: the run goes to the spool instead of being lost."""
    import sqlite3

    import quantrack.store.tracking as tr

    def full(*_a: object, **_k: object) -> str:
        raise RuntimeError("(sqlite3.OperationalError) database or disk is full") from sqlite3.OperationalError(
            "database or disk is full")

    monkeypatch.setattr(tr, "upload", full)
    logged = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "exp").log(_record())
    assert logged.run_id is None and logged.spooled is not None and "could not write" in (logged.reason or "")


# --- URIs and timeouts ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("uri", ["bogus://x", "mlruns", "ftp://host/x", "http://", "s3://bucket"])
def test_bad_tracking_uris(uri: str) -> None:
    with pytest.raises(BadInput, match="--tracking-uri"):
        resolve_uri(uri)


@pytest.mark.parametrize("uri", ["http://127.0.0.1:5000", "https://mlflow.example:443",
                                 "postgresql+psycopg2://u@127.0.0.1:5432/mlflow", "databricks", "file:./mlruns"])
def test_good_tracking_uris(uri: str) -> None:
    assert resolve_uri(uri) == uri


def test_tracking_uri_password_is_a_known_secret() -> None:
    resolve_uri("http://alice:tr4ck-pass-77@127.0.0.1:5000")
    assert "tr4ck-pass-77" in known_secrets()
    with pytest.raises(BadInput) as exc:
        resolve_uri("bogus://alice:tr4ck-pass-77@x")
    assert "tr4ck-pass-77" not in str(exc.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1, "abc", True])
def test_check_timeout_refuses(value: object) -> None:
    with pytest.raises(BadInput, match="--timeout"):
        check_timeout(value)


def test_http_timeout_separates_connect() -> None:
    t = http_timeout(60.0)
    assert (t.connect, t.read, t.write, t.pool) == (10.0, 60.0, 60.0, 60.0)
    assert http_timeout(2.0).connect == 2.0  # connect never longer than the whole request


# --- redaction by value ---------------------------------------------------------------------------------------

def test_env_json_stays_json_and_loses_url_passwords() -> None:
    env = {"HF_TOKEN": "hf_" + "x" * 30, "HTTPS_PROXY": f"http://bob:{PROXY_PASS}@proxy:3128", "CUDA_VISIBLE_DEVICES": "0"}
    text = redact_text(json.dumps(redact_env(env), indent=1, sort_keys=True))
    data = json.loads(text)  # still valid JSON
    assert data == {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": REDACTED, "HTTPS_PROXY": f"http://bob:{REDACTED}@proxy:3128"}


def test_study_toml_args_list_redacted() -> None:
    toml = f'[[arms]]\nname = "fp8"\nargs = ["--api-key", "{KEY}", "--seed", "1"]\n'
    out = redact_text(toml)
    assert KEY not in out and f'args = ["--api-key", "{REDACTED}", "--seed", "1"]' in out


def test_env_values_are_scrubbed_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "wandb-" + "q" * 20)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "mlflow-pw-" + "z" * 6)
    monkeypatch.setenv("HTTP_PROXY", f"http://u:{PROXY_PASS}@p:1")
    monkeypatch.setenv("HF_HUB_DISABLE_TOKEN", "1")  # a switch, not a secret: "1" stays "1"
    text = f"echo wandb-{'q' * 20} mlflow-pw-{'z' * 6} {PROXY_PASS} step 1"
    assert redact_text(text) == f"echo {REDACTED} {REDACTED} {REDACTED} step 1"


def test_argv_registers_hidden_values_for_later_text() -> None:
    assert redact_argv(["vllm", "serve", "m", "--api-key", KEY]) == ["vllm", "serve", "m", "--api-key", REDACTED]
    # the engine echoes it later in a shape no pattern knows
    assert redact_text(f"error: key={KEY[::1]}!") == f"error: key={REDACTED}!"


def test_redacting_stream(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    register_secret("s3cr3t-value-1")
    stream = RedactingStream(sys.stderr)
    stream.write("View run at: http://user:pw-in-url@host:5000/#/x with s3cr3t-value-1\n")
    stream.flush()
    assert capsys.readouterr().err == f"View run at: http://user:{REDACTED}@host:5000/#/x with {REDACTED}\n"
    with pytest.raises(TypeError):
        stream.write(b"bytes")  # type: ignore[arg-type]
    assert not hasattr(stream, "buffer")


def test_cli_stderr_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrack.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", "--experiment", "x", "--tracking-uri", "bogus://al:cli-pass-9876@x"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "cli-pass-9876" not in err and REDACTED in err


# --- fleet job file, skypilot export, exposed servers ---------------------------------------------------------

def test_fleet_job_dir_private(tmp_path: Path) -> None:
    from quantrack.fleet.ray_runner import (
        _private_workdir,
        _read_private,
        _write_private,
    )

    d = _private_workdir("exp", "H100/bf16", 1, "abcdef0123")
    try:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700 and d.name.startswith("quantrack-fleet-exp-H100_bf16-a1-")
        job = d / "job.pkl"
        _write_private(job, b"payload")
        assert stat.S_IMODE(job.stat().st_mode) == 0o600 and _read_private(job) == b"payload"
        with pytest.raises(FileExistsError):
            _write_private(job, b"swapped")  # O_EXCL: never writes through a planted file
        os.chmod(job, 0o644)
        with pytest.raises(PermissionError, match="not private"):
            _read_private(job)
        os.chmod(job, 0o600)
        os.chmod(d, 0o755)
        with pytest.raises(PermissionError, match="not private"):
            _read_private(job)
    finally:
        os.chmod(d, 0o700)
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def test_skypilot_export_writes_no_secret(tmp_path: Path) -> None:
    from quantrack.fleet.skypilot import export_skypilot
    from quantrack.study import load_study

    src = Path(__file__).resolve().parents[2] / "examples" / "fleet-h100-a100.toml"
    text = src.read_text(encoding="utf-8")
    hf, wandb = "hf_" + "P" * 30, "wandb-" + "w" * 24
    text = text.replace('version = "0.11.0"\n', f'version = "0.11.0"\nenv = {{HF_TOKEN = "{hf}", WANDB_API_KEY = '
                        f'"{wandb}", CUDA_LAUNCH_BLOCKING = "0"}}\n', 1)
    text = text.replace('name = "bf16"\nweights = "bf16"\n',
                        f'name = "bf16"\nweights = "bf16"\nargs = ["--api-key", "{KEY}", "--seed", "1"]\n', 1)
    study_path = tmp_path / "study.toml"
    study_path.write_text(text, encoding="utf-8")
    tasks = export_skypilot(load_study(study_path), tmp_path / "out")
    blob = "".join(p.read_text() for p in (tmp_path / "out").iterdir())
    for secret in (hf, wandb, KEY):
        assert secret not in blob
    assert 'CUDA_LAUNCH_BLOCKING = "0"' in blob and '"--seed", "1"' in blob
    import yaml

    task = yaml.safe_load(tasks[0].yaml_path.read_text())
    assert set(task["secrets"]) >= {"HF_TOKEN", "WANDB_API_KEY"} and all(v is None for v in task["secrets"].values())
    assert any("WANDB_API_KEY left out" in n for n in tasks[0].notes)


@pytest.mark.parametrize(("host", "argv", "expect"), [
    ("127.0.0.1", [], None), ("localhost", [], None), ("::1", [], None),
    ("0.0.0.0", [], "exposes an unauthenticated engine"),
    ("0.0.0.0", ["--api-key", "k"], "protected only by its API key"),
    ("192.168.1.5", [], "exposes an unauthenticated engine"),
    # issue #30: the host given through the engine's own arguments, in every spelling the engines accept
    ("127.0.0.1", ["--host", "0.0.0.0"], "[engine] args --host 0.0.0.0 exposes"),
    ("127.0.0.1", ["--host=0.0.0.0"], "[engine] args --host 0.0.0.0 exposes"),
    ("127.0.0.1", ["--host", "::"], "[engine] args --host :: exposes"),
    ("127.0.0.1", ["--host", "[::]"], "[engine] args --host [::] exposes"),
    ("127.0.0.1", ["-m", "x.gguf", "--host", "10.0.0.7", "--port", "8080"], "--host 10.0.0.7 exposes"),
    ("127.0.0.1", ["--host", "0.0.0.0", "--api-key=k"], "protected only by its API key"),
    ("127.0.0.1", ["--host", "127.0.0.2"], None), ("127.0.0.1", ["--host=[::1]"], None),
])
def test_exposure_warning(host: str, argv: list[str], expect: str | None) -> None:
    from quantrack.cli.serve import exposure_warning

    got = exposure_warning(host, argv)
    assert (got is None) if expect is None else (got is not None and expect in got), got


def test_exposure_warning_reads_llama_cpp_host_variable() -> None:
    from quantrack.cli.serve import exposure_warning

    got = exposure_warning("127.0.0.1", [], env={"LLAMA_ARG_HOST": "0.0.0.0"})
    assert got is not None and got.startswith("env LLAMA_ARG_HOST = 0.0.0.0 exposes")


def test_spooled_record_is_json_and_holds_no_credentials() -> None:
    """Found by the fault suite: a redacted `--api-key [REDACTED]` param swallowed the JSON quote after it, and
    the spooled target URI kept a (redacted, hence unusable) password."""
    rec = _record()
    rec.param("engine_args", ["--api-key", KEY, "--seed", "1"])
    rec.tag("error", f"usage: server: error: unrecognized arguments: --api-key {KEY}")
    d = spool_record(rec, f"http://alice:{PROXY_PASS}@127.0.0.1:5000", "server down")
    text = (d / "record.json").read_text()
    data = json.loads(text)
    assert KEY not in text and PROXY_PASS not in text
    assert data["target_uri"] == "http://127.0.0.1:5000"
    assert data["params"]["engine_args"] == f"--api-key {REDACTED} --seed 1"


def test_tracking_server_answering_garbage_spools_the_run() -> None:
    """/health says 200 but every API call answers bytes that are not JSON: the run is spooled, not lost."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Garbage(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"\x00\xffgarbag")

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        logged = Tracker(f"http://127.0.0.1:{srv.server_address[1]}", "exp").log(_record())
    finally:
        srv.shutdown()
        srv.server_close()
    assert logged.run_id is None and logged.spooled is not None
    assert [p.name for p in pending_spool()] == [logged.uuid]


def test_eval_records_and_meta_never_written_through_a_link(tmp_path: Path) -> None:
    """Issue #30: `eval --output LINK --overwrite` wrote through the link. The records writer and its .meta.json
    refuse a link (even a dangling one) with one line naming it; the target is untouched."""
    from quantrack.accuracy.records import RecordWriter, write_meta
    from quantrack.errors import BadInput

    target = tmp_path / "precious.jsonl"
    target.write_text("keep\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    for resume in (False, True):
        with pytest.raises(BadInput, match=r"--output .*out\.jsonl is a symbolic link"):
            RecordWriter(link, resume=resume)
    meta = tmp_path / "r.jsonl.meta.json"
    meta.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(BadInput, match="symbolic link"):
        write_meta(tmp_path / "r.jsonl", {"task": "gsm8k"})
    assert target.read_text() == "keep\n" and not (tmp_path / "nowhere.json").exists()


def test_a_link_inside_a_spool_entry_is_never_uploaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #30: a symlink inside a spool entry uploaded its target's content. `sync` refuses the entry, naming
    the link, and the store never sees the target."""
    from quantrack.store.records import RunRecord
    from quantrack.store.tracking import spool_record, sync_spool

    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(tmp_path / "spool"))
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY\n")
    rec = RunRecord(experiment="e", run_name="a")
    rec.artifacts["notes/a.txt"] = "hello\n"
    entry = spool_record(rec, f"sqlite:///{tmp_path}/store/mlflow.db", "test")
    (entry / "artifacts" / "notes" / "b.txt").symlink_to(secret)
    result = sync_spool(f"sqlite:///{tmp_path}/store/mlflow.db")
    assert not result.uploaded and len(result.failed) == 1
    assert "is a symbolic link" in result.failed[0][1] and "b.txt" in result.failed[0][1]
    assert not (tmp_path / "store").exists() or "PRIVATE KEY" not in "".join(
        p.read_text(errors="replace") for p in (tmp_path / "store").rglob("*") if p.is_file() and p.suffix != ".db")


@pytest.mark.slow  # a real MLflow store: seconds
def test_sync_ends_a_whole_run_left_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI flake of test_double_sigint…_in_a_loop: the second Ctrl-C landed after the arm's run was marked whole
    but before its status was set; `sync` skipped the spooled KILLED record and the arm stayed RUNNING. Now the
    status is set before the completeness tag, and `sync` ends a whole run that is still RUNNING with the spooled
    record's status."""
    from quantrack.store.tracking import _client, experiment_id, find_run_by_uuid, upload

    monkeypatch.setenv("QUANTRACK_SPOOL_DIR", str(tmp_path / "spool"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rec = _record("q8_0")
    rec.status = "RUNNING"
    Tracker(uri, rec.experiment).log(rec)  # a whole run, RUNNING: what the killed process left
    client = _client(uri)
    exp_id = experiment_id(client, rec.experiment, uri)
    assert find_run_by_uuid(client, exp_id, rec.uuid).info.status == "RUNNING"
    rec.status, rec.end_ms = "KILLED", rec.start_ms + 1000
    spool_record(rec, uri, "forced exit")
    res = sync_spool()
    assert res.skipped == [rec.uuid] and not res.failed
    run = find_run_by_uuid(client, exp_id, rec.uuid)
    assert run.info.status == "KILLED" and run.info.end_time == rec.end_ms
    # and a fresh upload of a terminal record is ended before it is marked whole
    other = _record("fp8")
    other.status, other.end_ms = "FAILED", other.start_ms + 5
    calls: list[str] = []
    real_term = client.set_terminated
    monkeypatch.setattr(client, "set_terminated", lambda *a, **k: (calls.append("status"), real_term(*a, **k)))
    import quantrack.store.tracking as tr
    real_batch = tr._log_batch
    monkeypatch.setattr(tr, "_log_batch", lambda c, rid, **k: (
        calls.append("complete") if any(t.key == tr.TAG_COMPLETE for t in k.get("tags") or []) else None,
        real_batch(c, rid, **k))[-1])
    upload(client, exp_id, other, None)
    assert calls == ["status", "complete"]
