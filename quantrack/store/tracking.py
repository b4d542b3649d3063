"""MLflow tracking: the only module that imports mlflow (always inside functions).

It owns:

* ``RunRecord``: everything one run holds (params, metrics with steps, tags, artifacts, status, times),
  built in full before anything is sent, so a run is logged the same way whether it goes to the store
  now or to the spool and later through ``sync``;
* ``Tracker``: logs records to one experiment (a study = a parent run with nested arm runs);
  a shared ``http(s)://`` server that cannot be reached makes it spool the record locally instead;
* the spool (``$QUANTRACK_SPOOL_DIR`` or ``~/.cache/quantrack/spool``) and ``sync_spool`` which uploads it,
  idempotently: every run carries a ``quantrack.run_uuid`` tag and a run already complete on the
  server is skipped;
* ``load_runs``: the runs of an experiment as plain ``RunRow`` objects for compare/audit, read directly
  from SQLite or the server's REST API by ``quantrack.store.direct`` (no mlflow import), else with one
  ``mlflow.search_runs`` call.

The default store is ``sqlite:///mlruns/mlflow.db`` with artifacts in ``mlruns/artifacts`` (MLflow 3
deprecates the file store). Every string that reaches a store or the spool is redacted first
(``quantrack.redact``), by name and by value (``quantrack.redact.known_secrets``).

Files are written whole or not at all (:func:`atomic_write_text`: a temp file in the same folder, fsync,
rename); a refusal of the OS (missing folder, full disk) is one line naming the path. The spool is private
(folders 0700, files 0600); a spool entry whose write was interrupted is reported by ``sync``.
Every HTTP call to a tracking server is bounded (:func:`request_timeout_s`; ``--timeout`` or
``$MLFLOW_HTTP_REQUEST_TIMEOUT``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantrack import __version__
from quantrack.errors import BadInput, NotFound, QuantrackError
from quantrack.redact import (
    RedactingStream,
    redact_text,
    strip_credentials,
)
from quantrack.run.schema import (
    STATUS_KILLED,
    NodeFact,
    Role,
    Tag,
    probe_bf16_stack_ms,
    probe_fp8_speedup,
    probe_fp8_stack_ms,
)
from quantrack.store.files import atomic_write_text, os_refusal
from quantrack.store.records import Logged, MetricPoint, RunRecord, RunRow, TrackingError, now_ms
from quantrack.store.uri import (
    DEFAULT_URI,
    artifact_root_for,
    is_remote,
    quick_http,
    resolve_uri,
    server_reachable,
)

# MLflow 3's product telemetry (mlflow/telemetry/client.py, 3.17.2): the first logged call starts a thread that
# fetches a config from mlflow.org; without a network that thread calls ``_set_telemetry_client(None)``, which
# pops ``_MLFLOW_TELEMETRY_SESSION_ID`` from ``os.environ`` while quantrack's own thread may be walking
# ``os.environ`` (a record's redaction reads secret-named variables) -> ``KeyError: '_MLFLOW_TELEMETRY_SESSION_ID'``
# and a refused arm (issue #31). quantrack sends its measurements to the user's store and nowhere else: MLflow's
# telemetry is off in a process that imports quantrack's tracking, unless the user set the variable. MLflow reads
# ``MLFLOW_DISABLE_TELEMETRY`` (or ``DO_NOT_TRACK``) at import and again before every tracked call
# (mlflow/telemetry/utils.py ``is_telemetry_disabled``, mlflow/telemetry/track.py ``record_usage_event``), so
# setting it here works even when mlflow was imported first. docs/tracking.md says so.
TELEMETRY_ENV = "MLFLOW_DISABLE_TELEMETRY"
os.environ.setdefault(TELEMETRY_ENV, "true")

TAG_UUID = Tag.RUN_UUID
TAG_COMPLETE = Tag.COMPLETE
TAG_ROLE = Tag.ROLE  # Role.STUDY (parent) or Role.ARM
TAG_STUDY = Tag.STUDY
TAG_ARM = Tag.ARM
TAG_PARENT_UUID = Tag.PARENT_UUID
TAG_SPOOLED = Tag.SPOOLED
PROCESS_TAGS = (Tag.HOSTNAME, Tag.BOOT_ID, Tag.PID_NAMESPACE, Tag.PID, Tag.PID_START)
STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _quiet_mlflow_logs() -> None:
    """Keep MLflow's and alembic's INFO lines ("Creating initial MLflow database tables…") off quantrack's output;
    their warnings and errors still show."""
    import logging

    for name in ("mlflow", "alembic"):
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET or lg.level < logging.WARNING:
            lg.setLevel(logging.WARNING)
    # its SQLAlchemy error handler logs every database error with the whole traceback (~90 lines for a read-only
    # or full store) before re-raising it; quantrack classifies the error it raises and says it in one line
    db = logging.getLogger("mlflow.store.db.utils")
    if db.level == logging.NOTSET or db.level < logging.CRITICAL:
        db.setLevel(logging.CRITICAL)


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    _quiet_mlflow_logs()  # after the import: importing mlflow configures its loggers at INFO
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    # MlflowClient() creates (and migrates) a SQLite store on first use: two processes doing it at once on a
    # fresh file race ("table experiments already exists"), so it is done under a file lock, and retried
    return _store_created(Path(uri[len("sqlite:///"):]), lambda: MlflowClient(tracking_uri=uri))


STORE_LOCK_WAIT_S = 300.0  # a migration of a large store takes seconds; a lock held longer is a stuck process
_RACE_TEXTS = ("already exists", "database is locked", "duplicate column", "unique constraint failed: alembic")


def _store_created(db: Path, make: Callable[[], Any]) -> Any:
    """``make()`` (which creates or migrates the SQLite store ``db``) under an exclusive lock on
    ``.<name>.lock`` beside it; a create/migrate race that still happens (a process not using the lock, an
    older quantrack) is retried a few times. A folder where no lock file can be made (read-only) runs it
    without the lock."""
    with _file_lock(db.parent / f".{db.name}.lock"):
        for attempt in range(6):
            try:
                return make()
            except Exception as exc:
                if attempt == 5 or not any(t in str(exc).lower() for t in _RACE_TEXTS):
                    raise
                time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


@contextlib.contextmanager
def _file_lock(path: Path, wait_s: float = STORE_LOCK_WAIT_S) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: the retry above is all there is
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingError(f"the tracking store {path.parent} is locked by another process "
                                        f"({path} held for over {wait_s:.0f} s)") from None
                time.sleep(0.05)
            except OSError:  # a file system without locks
                break
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def experiment_id(client: Any, name: str, uri: str, create: bool = True) -> str | None:
    """Get or create an experiment by name (safe when many processes race to create it)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        if create and EXPERIMENT_KIND_TAG not in (exp.tags or {}):
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return str(exp.experiment_id)
    if not create:
        return None
    try:
        return str(client.create_experiment(name, artifact_location=artifact_root_for(uri),
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}))
    except Exception:  # another process created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _is_connectivity_error(exc: BaseException) -> bool:
    import httpx

    if isinstance(exc, (ConnectionError, TimeoutError, OSError, httpx.HTTPError)):
        return True
    text = f"{type(exc).__name__}: {exc}"
    return any(s in text for s in ("Max retries exceeded", "Connection refused", "ConnectionError",
                                   "Failed to establish", "RemoteDisconnected", "timed out",
                                   "API request to", "503", "502", "504"))


_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


_STORAGE_PHRASES = ("database or disk is full", "no space left on device", "disk quota exceeded",
                    "attempt to write a readonly database", "read-only file system", "disk i/o error")


def storage_reason(exc: BaseException) -> str | None:
    """What the store's disk refused (full, read-only, I/O error), in the words of the innermost error that says
    it (``attempt to write a readonly database``; mlflow's outer message is SQLAlchemy's autoflush note), or None
    when the error is not the disk's."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:  # mlflow/SQLAlchemy wrap the OSError or sqlite3 error
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _STORAGE_ERRNOS:
            return cur.strerror or str(cur)
        text = str(cur).lower()
        for phrase in _STORAGE_PHRASES:
            if phrase in text:
                return phrase
        cur = cur.__cause__ or cur.__context__
    return None


def _is_storage_error(exc: BaseException) -> bool:
    """The store's disk refused the write (full, read-only, I/O error): the record is spooled, not lost."""
    return storage_reason(exc) is not None


def find_run_by_uuid(client: Any, exp_id: str, run_uuid: str) -> Any | None:
    runs = client.search_runs([exp_id], filter_string=f"tags.`{TAG_UUID}` = '{run_uuid}'", max_results=5)
    return runs[0] if runs else None


def upload(client: Any, exp_id: str, record: RunRecord, parent_run_id: str | None,
           files_root: Path | None = None) -> str:
    """Create one run from a record: tags, params, metrics (with steps), artifacts, then status; a failure
    half-way deletes the run it created (nothing is left but the record the caller still holds)."""
    rec = record.redacted()
    tags = dict(rec.tags)
    tags[TAG_UUID] = rec.uuid
    tags[Tag.MLFLOW_RUN_NAME] = rec.run_name
    if rec.parent_uuid:
        tags[TAG_PARENT_UUID] = rec.parent_uuid
    if parent_run_id:
        tags[Tag.MLFLOW_PARENT_RUN_ID] = parent_run_id
    # create_run sets the run name (and its mlflow.runName tag) itself; sending that tag again would take the
    # store's set_tag path (a SELECT-then-INSERT merge, not retried on a unique-key race)
    tags.pop(Tag.MLFLOW_RUN_NAME, None)
    # the writer's identity goes with the run's creation: a process killed before its tags were sent leaves a
    # RUNNING run that `sync --stale` can still tell is its own (and end), never one it cannot place
    first = {TAG_UUID: rec.uuid, **{k: tags.pop(k) for k in PROCESS_TAGS if k in tags}}
    run = client.create_run(exp_id, start_time=rec.start_ms, tags=first, run_name=rec.run_name)
    run_id = run.info.run_id
    try:
        _fill(client, run_id, rec, tags, files_root)
    except BaseException:
        # an upload that failed half-way leaves nothing (the record is still where it came from: the caller spools
        # it, or sync keeps its spool entry); where even the delete fails, the next sync finds the run by its uuid
        # without the completeness tag and replaces it: never a second copy
        with contextlib.suppress(Exception):
            client.delete_run(run_id)
        raise
    return str(run_id)


def _fill(client: Any, run_id: str, rec: RunRecord, tags: dict[str, str], files_root: Path | None) -> None:
    """A created run's params, metrics, tags, artifacts, then its status, then the completeness tag."""
    from mlflow.entities import Metric, Param, RunTag

    params = [Param(k, v) for k, v in sorted(rec.params.items())]
    metrics = [Metric(m.key, m.value, m.timestamp, m.step) for m in rec.metrics]
    tag_list = [RunTag(k, v) for k, v in sorted(tags.items())]
    for i in range(0, max(len(params), 1), 100):
        _log_batch(client, run_id, params=params[i:i + 100])
    for i in range(0, len(metrics), 1000):
        _log_batch(client, run_id, metrics=metrics[i:i + 1000])
    for i in range(0, len(tag_list), 100):
        _log_batch(client, run_id, tags=tag_list[i:i + 100])
    if rec.artifacts or rec.artifact_files:
        with tempfile.TemporaryDirectory(prefix="quantrack-art-") as tmp:
            _materialize(rec, Path(tmp), files_root)
            client.log_artifacts(run_id, tmp)
    if rec.status != "RUNNING":
        # the status before the completeness tag: a process killed between the two left a run marked whole but
        # RUNNING, and `sync` then skipped the spooled KILLED record as "already on the server"
        # MLflow prints "View run ... at: URL" on stdout for a server store; stdout is the command's output,
        # and the URL may carry user:password
        with contextlib.redirect_stdout(_redacted_stderr()):
            client.set_terminated(run_id, rec.status, end_time=rec.end_ms or now_ms())
    _log_batch(client, run_id, tags=[RunTag(TAG_COMPLETE, "true")])  # last: the run is whole


_DUPLICATE = ("duplicate key", "UniqueViolation", "UNIQUE constraint failed")
_DUPLICATE_ROUNDS = 6  # read-back rounds after a duplicate-key refusal (waits 0.25, 0.5, 1, 2, 4 s: ~8 s in all)


def _not_yet_logged(data: Any, params: list[Any], metrics: list[Any], tags: list[Any]) -> tuple[list[Any], ...]:
    """What of a batch the run does not hold yet. A param held with another value is an error (params never
    change); a tag is re-sent until it holds this value; a metric key counts as held once present."""
    clash = [p.key for p in params if p.key in data.params and data.params[p.key] != p.value]
    if clash:
        raise TrackingError(f"run already holds other values for param(s) {', '.join(clash[:5])}")
    return ([p for p in params if p.key not in data.params],
            [m for m in metrics if m.key not in data.metrics],
            [t for t in tags if data.tags.get(t.key) != t.value])


def _log_batch(client: Any, run_id: str, params: list[Any] | None = None, metrics: list[Any] | None = None,
               tags: list[Any] | None = None, *, sleep: Callable[[float], None] | None = None) -> None:
    """``log_batch``, idempotent against the client's own retry. When a request times out on a loaded server,
    MLflow re-sends it; the first may have committed, or may still be running beside the retry, and the store's
    unique keys refuse one of the two ("duplicate key value violates unique constraint tag_pk" on PostgreSQL,
    issue #31). Then the run is read back (after a short wait, so a request still in flight can commit) and only
    what it does not hold yet is sent again, a bounded number of rounds; other errors are raised as before."""
    todo: tuple[list[Any], ...] = (list(params or []), list(metrics or []), list(tags or []))
    attempt = 0
    while True:
        try:
            client.log_batch(run_id, params=todo[0], metrics=todo[1], tags=todo[2])
            return
        except Exception as exc:
            if not any(d in str(exc) for d in _DUPLICATE):
                raise
            (sleep or time.sleep)(0.25 * 2 ** attempt)
            todo = _not_yet_logged(client.get_run(run_id).data, *todo)
            if not any(todo):
                return
            attempt += 1
            if attempt >= _DUPLICATE_ROUNDS:
                raise


def _redacted_stderr() -> Any:
    err = sys.stderr
    return err if isinstance(err, RedactingStream) else RedactingStream(err)


def _materialize(rec: RunRecord, dest: Path, files_root: Path | None = None) -> None:
    """Write a record's artifacts under dest (text redacted; text files copied are redacted too)."""
    for rel, text in rec.artifacts.items():
        p = dest / _safe_rel(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(redact_text(text, rec.secrets), encoding="utf-8")
    for rel, src in rec.artifact_files.items():
        src_path = Path(src)
        if files_root is not None and not src_path.is_absolute():
            src_path = files_root / src_path
        p = dest / _safe_rel(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        if src_path.suffix in (".log", ".txt", ".json", ".jsonl", ".md", ".csv", ".toml"):
            # byte-faithful: keep \r (progress bars) and undecodable bytes exactly as the engine wrote them
            with open(src_path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
                text = fh.read()
            with open(p, "w", encoding="utf-8", errors="surrogateescape", newline="") as fh:
                fh.write(redact_text(text, rec.secrets))
        else:
            shutil.copyfile(src_path, p)


def _safe_rel(rel: str) -> Path:
    parts = [p for p in Path(rel).parts if p not in ("", ".", "..", "/")]
    if not parts:
        raise BadInput(f"bad artifact path {rel!r}")
    return Path(*parts)


# --- the spool ---------------------------------------------------------------------------------------------

def spool_dir() -> Path:
    """The spool folder, absolute: a relative ``$QUANTRACK_SPOOL_DIR`` is taken from the working directory once,
    here, so every path under it (a spooled entry's artifact files) is absolute and never joined onto itself."""
    raw = os.environ.get("QUANTRACK_SPOOL_DIR") or str(Path.home() / ".cache" / "quantrack" / "spool")
    return Path(os.path.abspath(os.path.expanduser(raw)))


_PRIVATE_DIR, _PRIVATE_FILE = 0o700, 0o600


def _private_dir(path: Path) -> Path:
    """mkdir -p with 0700 on the folders quantrack creates (the spool holds runs, params, engine logs)."""
    path.mkdir(parents=True, exist_ok=True, mode=_PRIVATE_DIR)
    with contextlib.suppress(OSError):
        os.chmod(path, _PRIVATE_DIR)
    return path


def _make_private(tree: Path) -> None:
    for p in [tree, *tree.rglob("*")]:
        os.chmod(p, _PRIVATE_DIR if p.is_dir() else _PRIVATE_FILE)


def spool_record(record: RunRecord, target_uri: str, reason: str, folder: str = "pending") -> Path:
    """Store a (redacted) record on local disk for ``quantrack sync``; returns its directory.

    Written to a hidden ``.<uuid>.tmp`` folder and renamed: an entry is complete or absent. A failed write
    (full disk) removes its temp folder and raises one line naming the path; the folders are 0700 and the
    files 0600."""
    rec = record.redacted()
    root = spool_dir()
    d = root / folder / rec.uuid
    tmp = root / folder / f".{rec.uuid}.tmp"
    try:
        _private_dir(root)
        _private_dir(root / folder)
        if tmp.exists():
            shutil.rmtree(tmp)
        _private_dir(tmp)
        _materialize(rec, tmp / "artifacts")
        data = rec.to_json()
        # credentials are never written down: sync takes them from $MLFLOW_TRACKING_USERNAME/PASSWORD (mlflow's
        # own variables) or from `sync --tracking-uri`
        data.update({"target_uri": strip_credentials(target_uri), "spooled_at_ms": now_ms(), "reason": reason,
                     "artifact_paths": sorted([*rec.artifacts, *rec.artifact_files])})
        text = redact_text(json.dumps(data, indent=1, sort_keys=True), rec.secrets)
        with open(tmp / "record.json", "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        _make_private(tmp)
        if d.exists():
            shutil.rmtree(d)
        tmp.rename(d)  # atomic: a half-written spool entry is never picked up
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        where = exc.filename or tmp
        raise os_refusal(exc, where).__class__(
            f"could not spool run {rec.run_name!r} ({reason}): {os_refusal(exc, where)}") from None
    return d


def read_spool_json(path: Path) -> dict[str, Any]:
    """A spooled JSON file, or one line saying it is cut short / not a spool file (never the parser's
    exception): a disk that filled or a machine that died mid-write leaves a truncated file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TrackingError(f"{path} is not text (not a spool file?): inspect and delete it") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise TrackingError(f"{path} is empty (its write was interrupted): inspect and delete it") from None
        cut = exc.pos >= len(text.rstrip()) - 1 or "Unterminated" in exc.msg or "control character" in exc.msg
        what = "is cut short (truncated: its write was interrupted)" if cut else "is not valid JSON"
        raise TrackingError(f"{path} {what} at line {exc.lineno} column {exc.colno}: inspect and delete it") from None
    if not isinstance(data, dict):
        raise TrackingError(f"{path} holds a JSON {type(data).__name__}, not a spool entry: inspect and delete it")
    return data


def _load_spooled(d: Path) -> tuple[RunRecord, dict[str, Any]]:
    data = read_spool_json(d / "record.json")
    rec = RunRecord(
        experiment=data["experiment"], run_name=data["run_name"], params=data["params"],
        metrics=[MetricPoint(**m) for m in data["metrics"]], tags=data["tags"], status=data["status"],
        start_ms=data["start_ms"], end_ms=data["end_ms"], uuid=data["uuid"], parent_uuid=data["parent_uuid"],
    )
    art = d / "artifacts"
    if art.is_symlink():
        raise TrackingError(f"spool entry {d}: artifacts is a symbolic link (to {os.readlink(art)}); not uploaded "
                            "(quantrack never writes links into the spool): inspect and delete the entry")
    if art.is_dir():
        for p in sorted(art.rglob("*")):
            if p.is_symlink():  # never upload what a link points at
                raise TrackingError(f"spool entry {d}: {p.relative_to(d)} is a symbolic link (to {os.readlink(p)}); "
                                    "not uploaded (quantrack never writes links into the spool): inspect and "
                                    "delete the entry")
            if p.is_file():
                rec.artifact_files[p.relative_to(art).as_posix()] = str(p)
    return rec, data


CHECKPOINTS = "checkpoints"


def checkpoint_record(record: RunRecord, target_uri: str, after: str) -> Path:
    """The arm as it stands after a finished step, on disk (``<spool>/checkpoints/<uuid>``, written whole or not at
    all), so a ``kill -9`` of quantrack loses no finished step: ``quantrack sync`` uploads it once the process that
    wrote it is gone. Dropped when the arm is logged (:func:`drop_checkpoint`)."""
    return spool_record(record, target_uri, f"checkpoint after step {after}", folder=CHECKPOINTS)


def drop_checkpoint(run_uuid: str) -> None:
    shutil.rmtree(spool_dir() / CHECKPOINTS / run_uuid, ignore_errors=True)


def _adopt_checkpoints(result: SyncResult, say: Callable[[str], None]) -> None:
    """Checkpoints whose writing process is gone become pending entries (uploaded below, once: the same uuid as
    the run a later log or spool would make); a live writer's are left; an unknown one is left and said."""
    from quantrack.store.liveness import GONE, process_state

    root = spool_dir() / CHECKPOINTS
    if not root.is_dir():
        return
    for d in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            data = read_spool_json(d / "record.json")
            tags = data.get("tags") or {}
        except (OSError, TrackingError) as exc:
            result.failed.append((d.name, f"unreadable checkpoint: {exc}"))
            continue
        state, why = process_state(tags)
        if state != GONE:
            result.held.append((d.name, why))
            say(f"checkpoint {d.name[:8]} ({data.get('run_name')}) left: {why}")
            continue
        target = spool_dir() / "pending" / d.name
        _private_dir(target.parent)
        if target.exists():  # the forced exit spooled it too: that entry is the later word
            shutil.rmtree(d, ignore_errors=True)
            continue
        d.rename(target)
        say(f"checkpoint {d.name[:8]} ({data.get('run_name')}): {why}; uploading what it had, KILLED")


def pending_spool() -> list[Path]:
    root = spool_dir() / "pending"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                   and (p / "record.json").is_file()), key=lambda p: p.name)


def partial_spool() -> list[Path]:
    """Spool entries whose write never finished (a ``.tmp`` folder, or a folder without record.json)."""
    root = spool_dir() / "pending"
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and (p.name.startswith(".")
                                                                 or not (p / "record.json").is_file())),
                  key=lambda p: p.name)


def _update_spooled_status(run_uuid: str, status: str, end_ms: int) -> bool:
    d = spool_dir() / "pending" / run_uuid
    f = d / "record.json"
    if not f.is_file():
        return False
    data = read_spool_json(f)
    data["status"], data["end_ms"] = status, end_ms
    atomic_write_text(f, json.dumps(data, indent=1, sort_keys=True), mode=_PRIVATE_FILE)
    return True


def spool_terminate(target_uri: str, experiment: str, run_uuid: str, status: str, end_ms: int) -> Path:
    ops = spool_dir() / "ops"
    try:
        _private_dir(spool_dir())
        _private_dir(ops)
    except OSError as exc:
        raise os_refusal(exc, ops) from None
    p = ops / f"{run_uuid}-terminate.json"
    atomic_write_text(p, json.dumps({"op": "terminate", "target_uri": strip_credentials(target_uri),
                                     "experiment": experiment,
                                     "uuid": run_uuid, "status": status, "end_ms": end_ms}), mode=_PRIVATE_FILE)
    return p


@dataclass
class SyncResult:
    uploaded: list[str] = field(default_factory=list)  # run uuids
    skipped: list[str] = field(default_factory=list)  # already on the server
    failed: list[tuple[str, str]] = field(default_factory=list)  # (uuid, reason)
    terminated: list[str] = field(default_factory=list)
    held: list[tuple[str, str]] = field(default_factory=list)  # checkpoints of a live (or unknown) writer: left


def sync_spool(uri: str | None = None, progress: Callable[[str], None] | None = None) -> SyncResult:
    """Upload spooled runs (parents before children); skip runs already complete on the server."""
    say = progress or (lambda _m: None)
    result = SyncResult()
    if uri:
        resolve_uri(uri)  # a bad --tracking-uri is refused even when the spool is empty
    _adopt_checkpoints(result, say)
    for d in partial_spool():  # never skipped in silence
        why = (f"partial spool entry {d} (its write was interrupted: no complete record.json); "
               "nothing to upload from it — inspect and delete it")
        result.failed.append((d.name.strip(".").removesuffix(".tmp"), why))
    entries = []
    for d in pending_spool():
        try:
            rec, data = _load_spooled(d)
        except (OSError, ValueError, KeyError, TypeError, TrackingError) as exc:
            result.failed.append((d.name, f"unreadable spool entry: {exc}"))
            continue
        entries.append((d, rec, uri or data.get("target_uri") or resolve_uri(None)))
    # parents first (no parent_uuid), then by start time
    entries.sort(key=lambda e: (e[1].parent_uuid is not None, e[1].start_ms, e[1].uuid))
    clients: dict[str, Any] = {}
    for d, rec, target in entries:
        target = resolve_uri(target)
        if not server_reachable(target):
            result.failed.append((rec.uuid, f"tracking server {target} unreachable"))
            continue
        try:
            with quick_http():
                client = clients.setdefault(target, _client(target))
                exp_id = experiment_id(client, rec.experiment, target)
                assert exp_id is not None
                existing = find_run_by_uuid(client, exp_id, rec.uuid)
                if existing is not None and existing.data.tags.get(TAG_COMPLETE) == "true":
                    result.skipped.append(rec.uuid)
                    ended = ""
                    if existing.info.status == "RUNNING" and rec.status != "RUNNING":
                        # whole on the server but never ended (a store written by an older quantrack, killed
                        # between its last tag and its status): the spooled record's status is the later word
                        with contextlib.redirect_stdout(_redacted_stderr()):
                            client.set_terminated(existing.info.run_id, rec.status,
                                                  end_time=rec.end_ms or now_ms())
                        ended = f"; its status set {rec.status} (it was RUNNING)"
                    say(f"skip {rec.run_name} ({rec.uuid[:8]}): already on {target} as {existing.info.run_id}"
                        + ended)
                else:
                    if existing is not None:  # a half-uploaded run from an interrupted attempt
                        client.delete_run(existing.info.run_id)
                    parent_id = None
                    if rec.parent_uuid:
                        parent = find_run_by_uuid(client, exp_id, rec.parent_uuid)
                        if parent is None:
                            result.failed.append((rec.uuid, f"parent run {rec.parent_uuid} not on the server yet"))
                            continue
                        parent_id = parent.info.run_id
                    rec.tags[TAG_SPOOLED] = "true"
                    run_id = upload(client, exp_id, rec, parent_id, files_root=d)
                    result.uploaded.append(rec.uuid)
                    say(f"uploaded {rec.run_name} ({rec.uuid[:8]}) -> {target} run {run_id}")
        except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the others
            result.failed.append((rec.uuid, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            continue
        done = spool_dir() / "synced" / d.name
        _private_dir(done.parent)
        if done.exists():
            shutil.rmtree(done)
        d.rename(done)
    _apply_ops(uri, result, clients, say)
    return result


def _apply_ops(uri: str | None, result: SyncResult, clients: dict[str, Any], say: Callable[[str], None]) -> None:
    ops = spool_dir() / "ops"
    if not ops.is_dir():
        return
    for p in sorted(ops.glob("*-terminate.json")):
        try:
            op = read_spool_json(p)
            op_uuid, target_uri = str(op["uuid"]), str(op["target_uri"])
        except (OSError, TrackingError, KeyError) as exc:
            why = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            result.failed.append((p.name.removesuffix("-terminate.json"), f"unreadable spool entry: {why}"))
            continue
        target = resolve_uri(uri or target_uri)
        if not server_reachable(target):
            result.failed.append((op_uuid, f"tracking server {target} unreachable"))
            continue
        try:
            with quick_http():
                client = clients.setdefault(target, _client(target))
                exp_id = experiment_id(client, op["experiment"], target)
                assert exp_id is not None
                run = find_run_by_uuid(client, exp_id, op_uuid)
                if run is None:
                    result.failed.append((op_uuid, "run to terminate not found on the server"))
                    continue
                if run.info.status == "RUNNING":
                    with contextlib.redirect_stdout(_redacted_stderr()):
                        client.set_terminated(run.info.run_id, op["status"], end_time=op["end_ms"])
                result.terminated.append(op_uuid)
                say(f"set {run.info.run_id} {op['status']}")
        except Exception as exc:  # noqa: BLE001
            result.failed.append((op_uuid, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            continue
        p.unlink()


@dataclass
class StaleResult:
    """What `sync --stale` found among the store's RUNNING runs: (run id, run name, experiment, why) each."""

    ended: list[tuple[str, str, str, str]] = field(default_factory=list)  # its process is gone: ended KILLED
    alive: list[tuple[str, str, str, str]] = field(default_factory=list)  # its process is running: left
    unknown: list[tuple[str, str, str, str]] = field(default_factory=list)  # cannot be told: left, and why


def end_stale_runs(uri: str | None = None, progress: Callable[[str], None] | None = None,
                   state: Callable[[Mapping[str, str]], tuple[str, str]] | None = None) -> StaleResult:
    """End KILLED every RUNNING run of the store whose writing process is gone (``quantrack.store.liveness``: the
    same host, boot and PID namespace, and that pid no longer that process), with ``quantrack.ended_by`` saying
    so; a run whose process is alive, or that cannot be placed (another host, no process tags), is left RUNNING
    and said. ``state``: the liveness check (tests)."""
    from quantrack.store.liveness import process_state

    say = progress or (lambda _m: None)
    target = resolve_uri(uri)
    if target.startswith("sqlite:"):
        _existing_store(target)  # nothing created: a store that is not there has no stale run
    look = state or process_state
    result = StaleResult()
    try:
        with quick_http():
            _end_stale(_client(target), look, result, say)
    except QuantrackError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line naming the store, never a traceback
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise TrackingError(f"sync --stale: the store {redact_text(target)} could not be searched or updated: "
                            f"{type(exc).__name__}: {redact_text(first)} (ended so far: {len(result.ended)})") from None
    return result


def _end_stale(client: Any, look: Callable[[Mapping[str, str]], tuple[str, str]], result: StaleResult,
               say: Callable[[str], None]) -> None:
    from mlflow.entities import ViewType

    for exp in client.search_experiments(view_type=ViewType.ACTIVE_ONLY):
        token = None
        while True:
            page = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'RUNNING'",
                                      max_results=1000, page_token=token)
            for run in page:
                _end_if_stale(client, run, exp.name, look, result, say)
            token = getattr(page, "token", None)
            if not token:
                break


def _end_if_stale(client: Any, run: Any, experiment: str, look: Callable[[Mapping[str, str]], tuple[str, str]],
                  result: StaleResult, say: Callable[[str], None]) -> None:
    from mlflow.entities import RunTag

    from quantrack.store.liveness import GONE, UNKNOWN

    tags = dict(run.data.tags)
    run_id = run.info.run_id
    name = run.info.run_name or tags.get(Tag.MLFLOW_RUN_NAME) or run_id
    verdict, why = look(tags)
    entry = (run_id, name, experiment, why)
    where = f"{name} ({run_id}, experiment {experiment!r})"
    if verdict == UNKNOWN:
        result.unknown.append(entry)
        say(f"left {where} RUNNING: unknown whether its process is gone: {why}")
        return
    if verdict != GONE:
        result.alive.append(entry)
        say(f"left {where} RUNNING: {why}")
        return
    note = f"sync --stale: {why}; ended KILLED when found (when it died is unknown: the end time is when sync found it)"
    _log_batch(client, run_id, tags=[RunTag(Tag.ENDED_BY, note)])
    with contextlib.redirect_stdout(_redacted_stderr()):
        client.set_terminated(run_id, STATUS_KILLED, end_time=now_ms())
    result.ended.append(entry)
    say(f"ended {where} KILLED: {why}")


# --- logging runs ------------------------------------------------------------------------------------------

class Tracker:
    """Logs the runs of one experiment to one store; spools when a shared server is unreachable."""

    def __init__(self, uri: str | None = None, experiment: str = "quantrack",
                 progress: Callable[[str], None] | None = None) -> None:
        if not experiment or not experiment.strip():
            raise BadInput("experiment name must not be empty")
        self.uri = resolve_uri(uri)
        self.experiment = experiment.strip()
        self._say = progress or (lambda _m: None)
        self._client: Any = None
        self._exp_id: str | None = None
        self._on_server: dict[str, str] = {}  # record uuid -> run id
        self._spooled: set[str] = set()

    def _connect(self) -> tuple[Any, str]:
        if self._client is None:
            self._client = _client(self.uri)
        if self._exp_id is None:
            self._exp_id = experiment_id(self._client, self.experiment, self.uri)
        assert self._exp_id is not None
        return self._client, self._exp_id

    def log(self, record: RunRecord) -> Logged:
        """Send a complete record (any status) to the store, or to the spool if the server is down."""
        record.experiment = self.experiment
        parent_id: str | None = None
        if record.parent_uuid:
            if record.parent_uuid in self._spooled:
                return self._spool(record, "parent run is spooled")
            parent_id = self._on_server.get(record.parent_uuid)
        if is_remote(self.uri) and not server_reachable(self.uri):
            return self._spool(record, f"tracking server {self.uri} unreachable")
        try:
            with quick_http():
                client, exp_id = self._connect()
                if record.parent_uuid and parent_id is None:
                    parent = find_run_by_uuid(client, exp_id, record.parent_uuid)
                    if parent is None:
                        return self._spool(record, "parent run not on the server")
                    parent_id = parent.info.run_id
                run_id = upload(client, exp_id, record, parent_id)
        except QuantrackError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below: connectivity spools, the rest is one line
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            if is_remote(self.uri):
                # unreachable, or answering garbage / errors: the run is kept in the spool, never lost
                return self._spool(record, f"tracking server {redact_text(self.uri)} failed: {type(exc).__name__}: "
                                           f"{redact_text(first)}")
            disk = storage_reason(exc)
            if disk is not None:  # the store's disk is full or read-only: keep the run in the spool
                return self._spool(record, f"tracking store {redact_text(self.uri)} could not write: {disk}")
            # any other refusal of a local store: the run is kept in the spool with the store's reason (sync
            # uploads it once the cause is fixed) and the study goes on; never a measured arm lost
            return self._spool(record, f"tracking store {redact_text(self.uri)} refused it: "
                                       f"{type(exc).__name__}: {redact_text(first)}")
        self._on_server[record.uuid] = run_id
        return Logged(uuid=record.uuid, run_id=run_id)

    def _spool(self, record: RunRecord, reason: str) -> Logged:
        path = spool_record(record, self.uri, reason)
        self._spooled.add(record.uuid)
        self._say(f"spooled run {record.run_name!r} to {path} ({reason}); upload later with `quantrack sync`")
        return Logged(uuid=record.uuid, spooled=path, reason=reason)

    def finish(self, logged: Logged, status: str, end_ms: int | None = None) -> None:
        """Terminate a run logged as RUNNING (a study's parent run)."""
        if status not in STATUSES:
            raise BadInput(f"unknown run status {status!r}; statuses: {', '.join(STATUSES)}")
        end = end_ms or now_ms()
        if logged.spooled is not None:
            _update_spooled_status(logged.uuid, status, end)
            return
        try:
            if is_remote(self.uri) and not server_reachable(self.uri):
                raise ConnectionError("unreachable")
            with quick_http():
                client, _ = self._connect()
                with contextlib.redirect_stdout(_redacted_stderr()):
                    client.set_terminated(logged.run_id, status, end_time=end)
        except Exception as exc:  # noqa: BLE001 - classified below
            if not (is_remote(self.uri) and _is_connectivity_error(exc)):
                raise TrackingError(f"could not set run {logged.run_id} {status}: {exc}") from None
            p = spool_terminate(self.uri, self.experiment, logged.uuid, status, end)
            self._say(f"spooled status {status} of run {logged.run_id} to {p}")


def log_arm(record: RunRecord, uri: str | None = None, experiment: str | None = None) -> Logged:
    """Log one arm run (no parent) — the library entry point behind ``quantrack log``."""
    return Tracker(uri, experiment or record.experiment).log(record)


# --- reading runs back -------------------------------------------------------------------------------------

def _existing_store(target: str) -> None:
    """A ``sqlite:///`` store to read must exist and be a file: one line otherwise, nothing created."""
    if not target.startswith("sqlite:///"):
        return
    from quantrack.store.direct import sqlite_path

    db = sqlite_path(target)
    if db is None:
        return
    if not db.exists():
        raise NotFound(f"no tracking store at {db}: nothing was logged there (`quantrack run` or `quantrack log` "
                       "creates it); check --tracking-uri / $MLFLOW_TRACKING_URI")
    if not db.is_file():
        raise BadInput(f"tracking store {db} is not a file")


def load_runs(experiment: str, uri: str | None = None, *, role: str | None = Role.ARM,
              include_running: bool = True, reader: str | None = None) -> list[RunRow]:
    """All runs of an experiment (one search), newest first, as plain ``RunRow`` objects.

    ``reader``: ``"auto"`` (default; ``$QUANTRACK_STORE_READER``) reads ``sqlite:///`` and ``http(s)://``
    stores directly, without importing mlflow (``quantrack.store.direct``: same rows, same order), and uses
    ``mlflow.search_runs`` for anything it cannot read; ``"mlflow"`` always uses mlflow.
    """
    from quantrack.store.direct import read_runs, reader_choice

    target = resolve_uri(uri, create=False)
    _existing_store(target)  # reading never creates a store (mlflow would create the file and its folders)
    how = (reader or reader_choice()).lower()
    if how not in ("auto", "mlflow"):
        raise BadInput(f"unknown store reader {how!r}; readers: auto, mlflow")
    rows = None
    if how == "auto":
        rows = read_runs(target, experiment, role, lambda names: _unknown_experiment(experiment, names, target))
    if rows is None:
        rows = _search_runs_mlflow(experiment, target, role)
    return rows if include_running else [r for r in rows if r.status != "RUNNING"]


def _store_refusal(target: str, exc: BaseException) -> QuantrackError:
    """One line for a store that failed a read: garbage answers are the URI's fault (exit 2)."""
    text = redact_text(" ".join(str(exc).split()))[:300]
    if "not in a valid JSON format" in text or isinstance(exc, (ValueError, UnicodeError)) and "JSON" in text:
        return BadInput(f"--tracking-uri {redact_text(target)} answered something that is not an MLflow "
                        "server's JSON (is it an mlflow server?)")
    if is_remote(target) and _is_connectivity_error(exc):
        return TrackingError(f"tracking server {redact_text(target)} failed: {type(exc).__name__}: {text[:200]}")
    return TrackingError(f"tracking store {redact_text(target)} refused the read: {type(exc).__name__}: {text}")


def _unknown_experiment(experiment: str, names: list[str], target: str) -> NotFound:
    from quantrack.errors import unknown

    return unknown("experiment", experiment, names) if names else NotFound(
        f"unknown experiment {experiment!r}: the store {target} has no experiments")


def _search_runs_mlflow(experiment: str, target: str, role: str | None) -> list[RunRow]:
    """The reference read: one ``mlflow.search_runs`` call."""
    import mlflow

    if is_remote(target) and not server_reachable(target):
        raise TrackingError(f"tracking server {target} is unreachable")
    mlflow.set_tracking_uri(target)
    try:
        with quick_http():
            client = _client(target)
            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                raise _unknown_experiment(experiment, [e.name for e in client.search_experiments()], target)
            filt = f"tags.`{TAG_ROLE}` = '{role}'" if role else ""
            runs = mlflow.search_runs(experiment_ids=[exp.experiment_id], filter_string=filt,
                                      output_format="list", order_by=["attributes.start_time DESC"])
    except QuantrackError:
        raise
    except Exception as exc:  # noqa: BLE001 - mlflow's errors become one line naming the store
        raise _store_refusal(target, exc) from None
    return [RunRow(
        run_id=r.info.run_id, experiment_id=str(r.info.experiment_id), run_name=r.info.run_name or "",
        status=r.info.status, start_time=int(r.info.start_time or 0),
        end_time=int(r.info.end_time) if r.info.end_time else None,
        params=dict(r.data.params), metrics=dict(r.data.metrics), tags=dict(r.data.tags),
        artifact_uri=r.info.artifact_uri or None,
    ) for r in runs]


def read_artifact_text(run_id: str, path: str, uri: str | None = None) -> str | None:
    """One text artifact of a run, or None when it does not exist."""
    import mlflow.artifacts

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    target = resolve_uri(uri, create=False)
    if target.startswith("sqlite:///") and not Path(target[len("sqlite:///"):]).is_file():
        return None  # reading never creates a store
    try:
        with tempfile.TemporaryDirectory(prefix="quantrack-dl-") as tmp:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=tmp,
                                                        tracking_uri=target)
            return Path(local).read_text(encoding="utf-8")
    except Exception:  # noqa: BLE001 - missing artifact: the caller prints n/a
        return None


def log_files_to_run(run_id: str, files: Mapping[str, Path], uri: str | None = None) -> None:
    """Add files to an existing run's artifacts (``{artifact path: local file}``), e.g. the decision report on
    a study's parent run after it finished. TrackingError when the store refuses."""
    target = resolve_uri(uri)
    if is_remote(target) and not server_reachable(target):
        raise TrackingError(f"tracking server {target} is unreachable")
    try:
        with quick_http(), tempfile.TemporaryDirectory(prefix="quantrack-art-") as tmp:
            for rel, src in files.items():
                dest = Path(tmp) / _safe_rel(rel)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest)
            with contextlib.redirect_stdout(sys.stderr):
                _client(target).log_artifacts(run_id, tmp)
    except QuantrackError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise TrackingError(f"tracking store {target} refused the artifacts of run {run_id}: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}") from None


# --- provenance --------------------------------------------------------------------------------------------

_GIT_REV: str | None = None


def git_state(where: Path) -> str:
    """``<sha>``, or ``<sha>-dirty`` when ANY tracked file of the repository holding ``where`` differs from that
    commit (staged or not, anywhere in the tree, not only under ``where``); ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
        rev = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
        if rev == "unknown":
            return rev
        top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=5, check=False).stdout.strip() or str(where)
        dirty = subprocess.run(["git", "-C", top, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=False)
        if dirty.returncode != 0:
            return f"{rev}-unknown-state"
        return f"{rev}-dirty" if dirty.stdout.strip() else rev
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def git_revision() -> str:
    """The quantrack checkout's git state (:func:`git_state`; ``unknown`` when installed from a wheel)."""
    global _GIT_REV
    if _GIT_REV is None:
        _GIT_REV = git_state(Path(__file__).resolve().parent)
    return _GIT_REV


def torch_version() -> str:
    """The installed torch's version from its package metadata (torch is never imported); ``unknown`` without it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown (torch is not installed here)"


def cuda_runtime() -> str:
    """The CUDA runtime the installed torch uses, from package metadata (nothing imported): the
    ``nvidia-cuda-runtime`` wheel's version, else torch's ``+cuXYZ`` build suffix; ``unknown (why)`` otherwise."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime"):
        try:
            return f"{version(dist)} ({dist})"
        except PackageNotFoundError:
            continue
    tv = torch_version()
    m = re.search(r"\+cu(\d+)(\d)$", tv)
    if m:
        return f"{m.group(1)}.{m.group(2)} (torch build {tv})"
    if tv.startswith("unknown"):
        return "unknown (torch is not installed here)"
    return f"unknown (no CUDA runtime wheel; torch {tv} names no CUDA build)"


def provenance_tags() -> dict[str, str]:
    """Versions, and the writing process's identity (host, boot, pid: `sync --stale` reads them)."""
    from quantrack.store.liveness import process_tags

    return {Tag.VERSION: __version__, Tag.GIT_REVISION: git_revision(), Tag.TORCH_VERSION: torch_version(),
            Tag.CUDA_RUNTIME: cuda_runtime(), **process_tags()}


def flatten(prefix: str, data: Mapping[str, Any]) -> dict[str, str]:
    """Nested dict -> dotted keys (for params from adapter query results)."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(key, v))
        elif v is not None:
            out[key] = str(v)
    return out


__all__ = [
    "DEFAULT_URI",
    "Logged",
    "MetricPoint",
    "RunRecord",
    "RunRow",
    "Tracker",
    "TrackingError",
    "git_revision",
    "load_runs",
    "log_arm",
    "log_files_to_run",
    "pending_spool",
    "provenance_tags",
    "read_artifact_text",
    "resolve_uri",
    "server_reachable",
    "spool_dir",
    "sync_spool",
]


# --- node facts (e.g. `quantrack probe --track`) -----------------------------------------------------------
NODE_FACTS_EXPERIMENT = NodeFact.EXPERIMENT


def log_node_fact(kind: str, data: Mapping[str, Any], tracking_uri: str | None = None,
                  experiment: str = NODE_FACTS_EXPERIMENT) -> str:
    """Log a measured fact about a node (the FP8 probe) as its own run, for `audit` to read beside the arms."""
    import json
    import socket

    device = dict(data.get("device") or {})
    rec = RunRecord(experiment=experiment, run_name=f"{kind}@{socket.gethostname()}")
    rec.tag(Tag.ROLE, Role.NODE_FACT)
    rec.tag(Tag.FACT, kind)
    rec.param(NodeFact.PARAM_HOSTNAME, socket.gethostname())
    rec.param(NodeFact.PARAM_GPU_NAME, device.get("name"))
    rec.param(NodeFact.PARAM_COMPUTE_CAPABILITY, device.get("compute_capability"))
    rec.param(NodeFact.PARAM_TORCH, device.get("torch"))
    rec.param(NodeFact.PARAM_TORCH_CUDA, device.get("torch_cuda"))
    rec.param(NodeFact.PARAM_MODEL, data.get("model"))
    rec.tag(NodeFact.TAG_PROBE_VERDICT, data.get("verdict"))
    rec.metric(NodeFact.METRIC_COPY_TBPS, data.get("copy_tbps"))
    for b in data.get("batches") or []:
        rec.metric(probe_fp8_speedup(b["batch"]), b.get("speedup"))
        rec.metric(probe_bf16_stack_ms(b["batch"]), b.get("bf16_stack_ms"))
        rec.metric(probe_fp8_stack_ms(b["batch"]), b.get("fp8_stack_ms"))
    rec.artifacts[f"{kind}.json"] = json.dumps(data, indent=1, default=str)
    logged = log_arm(rec, tracking_uri, experiment)
    return str(getattr(logged, "run_id", None) or rec.uuid)
