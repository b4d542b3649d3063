"""Run a study's (GPU type x arm) jobs across the nodes of a Ray cluster, one MLflow run per arm.

Driver (``run_study_on_ray``): logs the study's parent run, submits one Ray task per job asking for
the job's resources (``accelerator_type:<X>`` or the ``[fleet] resource``), shows pending / running
/ done per node, resubmits a job whose node or worker died (bounded by ``max_retries``), then records
it FAILED with the reason. Ctrl-C cancels every task (gracefully, then ``force``).

Task (on the node): starts a child process that runs the arm through ``quantrack.run`` and logs
its run to the central tracking URI. The child asks the kernel for SIGTERM when the task's worker
dies (``PR_SET_PDEATHSIG``) and turns SIGTERM into KeyboardInterrupt, so the runner's managed server
stops its engine process group even when Ray kills the worker or the node goes away. The job reaches
the child as a file in a fresh ``mkdtemp`` folder (0700, unpredictable name), written ``O_EXCL`` 0600 and
unpickled only if it and its folder belong to this user and are closed to everyone else.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from quantrack.arms import Arm
from quantrack.errors import BadInput, EnvironmentMissing
from quantrack.fleet import FleetJob, FleetSpec, parse_fleet, plan_jobs
from quantrack.run.schema import Param, Tag
from quantrack.study import Study

Progress = Callable[[str], None]
DEFAULT_ENTRY = "quantrack.fleet.ray_runner:run_and_log_arm"
GPU_FROM_CATALOG = "from catalog, not NVML"


@dataclass
class ArmContext:
    """What the function that runs one arm on a node gets besides the study and the arm."""

    tracking_uri: str
    experiment: str
    parent_uuid: str | None
    job_key: str
    attempt: int
    attempt_id: str
    workdir: Path
    progress: Progress


@dataclass
class JobResult:
    """One job's end: its run on the tracking store (if any) and where it ran."""

    key: str
    gpu: str | None
    arm: str
    status: str = "PENDING"  # FINISHED | FAILED | KILLED (rejected or interrupted) | CANCELLED
    run_id: str | None = None
    spooled: str | None = None
    error: str | None = None
    attempts: int = 0
    nodes: list[str] = field(default_factory=list)  # node ids tried, in order
    hostname: str | None = None
    gpu_name: str | None = None
    gpu_source: str | None = None


@dataclass
class FleetResult:
    study: str
    experiment: str
    tracking_uri: str
    parent_run_id: str | None
    results: list[JobResult]

    @property
    def failed(self) -> list[str]:
        return [r.key for r in self.results if r.status != "FINISHED"]


def summary_lines(result: FleetResult) -> list[str]:
    """One tab-separated line per job for the CLI: key, status, run id (or spool dir), error."""
    out = []
    for r in result.results:
        dest = r.run_id or (f"spooled ({r.spooled})" if r.spooled else "-")
        out.append(f"{r.key}\t{r.status}\t{dest}" + (f": {r.error}" if r.error else ""))
    return out


# --- on the node ---------------------------------------------------------------------------------------------

def study_on_node(job: FleetJob, spec: FleetSpec, study: Study, ray_node_id: str | None) -> tuple[Study, dict[str, Any]]:
    """``--gpu auto`` semantics on this node: NVML when there is a GPU, else the job's catalog GPU (labelled)."""
    from quantrack.run.steps import local_node

    facts = local_node()
    facts["ray_node_id"] = ray_node_id
    facts["fleet_gpu"] = job.gpu
    if facts.get("gpu_name"):
        facts["gpu_source"] = "NVML"
        return replace(study, gpu=replace(study.gpu, name="auto")), facts
    name = spec.gpu_override or job.gpu or (study.gpu.name if study.gpu.name != "auto" else None)
    if not name:
        raise BadInput("no NVIDIA GPU on this node and no GPU to assume: set [fleet] gpu_override or [fleet] gpus")
    from quantrack.hardware.catalog import get_gpu

    facts["gpu_source"] = GPU_FROM_CATALOG
    return replace(study, gpu=replace(study.gpu, name=get_gpu(name).name)), facts


def run_and_log_arm(study: Study, arm: Arm, node: dict[str, Any], ctx: ArmContext) -> dict[str, Any]:
    """The default per-arm function: ``quantrack.run.orchestrate.run_arm`` then one run on the central store."""
    from quantrack.run.orchestrate import run_arm
    from quantrack.run.outcome import ArmOutcome, RunOptions
    from quantrack.run.record import record_for_arm
    from quantrack.store.tracking import Tracker

    out = ArmOutcome(arm=arm, node=dict(node))
    tracker = Tracker(ctx.tracking_uri, ctx.experiment, progress=ctx.progress)
    try:
        run_arm(study, arm, RunOptions(tracking_uri=ctx.tracking_uri, workdir=ctx.workdir), ctx.workdir,
                node, ctx.progress, out=out)  # steps write into ``out``: an interrupt keeps what they measured
    except KeyboardInterrupt:
        out.status = "KILLED"
        out.error = f"interrupted (task cancelled or node lost) in step {out.failed_step or out.step or 'none'}"
        raise
    finally:
        rec = record_for_arm(study, out, experiment=ctx.experiment, parent_uuid=ctx.parent_uuid)
        _fleet_params(rec, node, ctx)
        logged = tracker.log(rec)
        ctx.progress(f"[{arm.name}] logged {rec.status} -> {logged.run_id or logged.spooled}")
    return {"status": out.status, "run_id": logged.run_id, "spooled": str(logged.spooled or "") or None,
            "error": out.error}


def _fleet_params(rec: Any, node: dict[str, Any], ctx: ArmContext) -> None:
    rec.param(Param.RAY_NODE_ID, node.get("ray_node_id"))
    rec.param(Param.GPU_SOURCE, node.get("gpu_source"))
    rec.param(Param.FLEET_GPU, node.get("fleet_gpu"))
    rec.param(Param.FLEET_ATTEMPT, ctx.attempt)
    rec.tag(Tag.FLEET, "ray")
    rec.tag(Tag.FLEET_JOB, ctx.job_key)
    rec.tag(Tag.FLEET_ATTEMPT_ID, ctx.attempt_id)


def _set_parent_death_signal(sig: int) -> None:
    """Linux: deliver ``sig`` to this process when the thread that forked it exits."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, sig, 0, 0, 0)


def _watch_parent(parent: int) -> None:
    """Belt and braces for the parent-death signal (non-Linux, or a missed signal): poll the parent pid."""
    import threading

    if not parent:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="quantrack-parent-watch", daemon=True).start()


def _child_main(job_path: str, result_path: str) -> int:
    """Runs in the child process the Ray task starts: one arm, one run, result as JSON."""
    expected_parent = int(os.environ.get("QUANTRACK_FLEET_PARENT", "0"))
    _set_parent_death_signal(signal.SIGTERM)
    if expected_parent and os.getppid() != expected_parent:  # the task died before we armed the signal
        return 3

    def _interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    _watch_parent(expected_parent)
    job: dict[str, Any] = pickle.loads(_read_private(Path(job_path)))  # our own task's file, checked first
    result: dict[str, Any] = {}
    say: Progress = lambda m: print(m, flush=True)
    try:
        study, node = study_on_node(job["job"], job["spec"], job["study"], job["ray_node_id"])
        result.update(hostname=node.get("hostname"), gpu_name=node.get("gpu_name") or study.gpu.name,
                      gpu_source=node.get("gpu_source"))
        module, _, attr = job["entry"].partition(":")
        fn = getattr(importlib.import_module(module), attr)
        ctx = ArmContext(tracking_uri=job["tracking_uri"], experiment=job["experiment"],
                         parent_uuid=job["parent_uuid"], job_key=job["job"].key, attempt=job["attempt"],
                         attempt_id=job["attempt_id"], workdir=Path(job["workdir"]), progress=say)
        result.update(fn(study, job["job"].arm, node, ctx) or {})
    except KeyboardInterrupt:
        result.update(status="KILLED", error=result.get("error") or "interrupted (task cancelled or node lost)")
    except Exception as exc:  # noqa: BLE001 - reported to the driver as this arm's failure, one line
        result.update(status="FAILED", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    from quantrack.redact import redact_text
    from quantrack.store.files import atomic_write_text

    atomic_write_text(result_path, redact_text(json.dumps(result)), mode=0o600)
    return 0


def _read_private(path: Path) -> bytes:
    """The job file's bytes, only if it and its folder are ours and closed to everyone else (0700 / 0600):
    a pickle is code, and a file another user could have written or swapped is never loaded."""
    me = os.geteuid()
    folder = os.stat(path.parent)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        st = os.fstat(fd)
        if (folder.st_uid != me or folder.st_mode & 0o077 or st.st_uid != me or st.st_mode & 0o077
                or not stat.S_ISREG(st.st_mode)):
            raise PermissionError(f"refusing job file {path}: not private to this user (folder 0700, file 0600)")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read()
    finally:
        if fd >= 0:
            os.close(fd)


def _private_workdir(experiment: str, key: str, attempt: int, attempt_id: str) -> Path:
    """A fresh ``mkdtemp`` folder (0700, unpredictable name) per attempt: nothing another user can plant."""
    prefix = f"quantrack-fleet-{_safe(experiment)[:40]}-{_safe(key)[:40]}-a{attempt}-{attempt_id[:8]}-"
    return Path(tempfile.mkdtemp(prefix=prefix))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _arm_task(payload: dict[str, Any], board: Any) -> dict[str, Any]:
    """The Ray task: run the arm in a child process; stop it if this task is cancelled."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    host = socket.gethostname()
    job: FleetJob = payload["job"]
    board.started.remote(job.key, node_id, host, payload["attempt"])
    workdir = _private_workdir(payload["experiment"], job.key, payload["attempt"], payload["attempt_id"])
    job_path, result_path = workdir / "job.pkl", workdir / "result.json"
    _write_private(job_path, pickle.dumps({**payload, "ray_node_id": node_id, "workdir": str(workdir)}))
    env = {**os.environ, "QUANTRACK_FLEET_PARENT": str(os.getpid())}
    log_path = workdir / "arm.log"
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "quantrack.fleet.ray_runner", "--child", str(job_path), str(result_path)],
            # own session: when Ray tears the worker down it must not take the arm process with it before the
            # arm has stopped its engine (the parent-death signal tells the arm instead)
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while child.poll() is None:
                time.sleep(0.2)
        except BaseException:  # cancelled (KeyboardInterrupt) or anything else: stop the arm, then re-raise
            _stop_child(child)
            raise
    out: dict[str, Any] = {"node_id": node_id, "hostname": host, "log": str(log_path)}
    try:
        out.update(json.loads(result_path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError):
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [""]
        out.update(status="FAILED", error=f"arm process exited {child.returncode} without a result: {tail[0][:300]}")
    return out


def _stop_child(child: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    if child.poll() is not None:
        return
    child.terminate()  # SIGTERM -> KeyboardInterrupt in the child -> the managed server stops the engine
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


# --- on the driver -------------------------------------------------------------------------------------------

class _Board:
    """A tiny actor the tasks tell when they start (so the driver can show running per node)."""

    def __init__(self) -> None:
        self._events: list[tuple[str, str, str, int]] = []

    def started(self, key: str, node_id: str, host: str, attempt: int) -> None:
        self._events.append((key, node_id, host, attempt))

    def drain(self) -> list[tuple[str, str, str, int]]:
        ev, self._events = self._events, []
        return ev


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EnvironmentMissing("--ray needs Ray: pip install 'quantrack[fleet]'") from None
    return ray


def _check_tracking(uri: str, ray: Any) -> None:
    from quantrack.store.uri import is_remote

    ips = {n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")}
    if not is_remote(uri) and len(ips) > 1:
        raise BadInput(f"tracking URI {uri!r} is local to this machine but the Ray cluster spans {len(ips)} hosts; "
                       "start an `mlflow server` every node can reach and pass its http:// URI")


def _missing_resources(jobs: list[FleetJob], ray: Any) -> dict[str, str]:
    have = ray.cluster_resources()
    missing: dict[str, str] = {}
    for j in jobs:
        for r in j.resources:
            if r not in have:
                missing[j.key] = r
        if j.num_gpus and have.get("GPU", 0) < j.num_gpus:
            missing[j.key] = f"GPU x{j.num_gpus}"
    return missing


def run_study_on_ray(
    study: Study,
    address: str | None,
    tracking_uri: str | None,
    *,
    max_retries: int | None = None,
    progress: Progress = print,
    entry: str = DEFAULT_ENTRY,
    poll_s: float = 0.5,
    cancel_grace_s: float = 30.0,
) -> FleetResult:
    """Every (GPU type x arm) of ``study`` as a Ray task; one MLflow run per arm on ``tracking_uri``.

    ``address``: "auto" (the running cluster), "ray://host:10001" / "host:6379", or None for an already
    initialised Ray. ``max_retries``: re-runs of a job whose node/worker died (None: ``[fleet] max_retries``).
    ``entry``: "module:function" run on the node for each arm (default: the single-node runner + MLflow).
    """
    from quantrack.run.record import study_record
    from quantrack.run.steps import local_node
    from quantrack.store.tracking import Tracker
    from quantrack.store.uri import resolve_uri

    spec = parse_fleet(study)
    retries = spec.max_retries if max_retries is None else max_retries
    if retries < 0:
        raise BadInput(f"max_retries must be >= 0, got {retries}")
    jobs = plan_jobs(study, spec)
    uri = resolve_uri(tracking_uri or study.tracking.uri)
    experiment = study.tracking.experiment or study.name
    ray = _import_ray()
    started_ray = False
    if not ray.is_initialized():
        try:
            ray.init(address=address or "auto", log_to_driver=False, logging_level="WARNING")
        except ConnectionError as exc:
            raise BadInput(f"--ray {address or 'auto'}: no Ray cluster there ({str(exc).splitlines()[0]})") from None
        started_ray = True
    try:
        _check_tracking(uri, ray)
        missing = _missing_resources(jobs, ray)
        if missing:
            key, res = next(iter(missing.items()))
            have = sorted(k for k in ray.cluster_resources() if not k.startswith("node:"))
            raise BadInput(f"no node in the Ray cluster offers {res!r} (needed by {key}); cluster resources: "
                           f"{', '.join(have)}")
        tracker = Tracker(uri, experiment, progress=progress)
        parent_rec = study_record(study, experiment, local_node())
        parent_rec.tag(Tag.FLEET, "ray")
        parent_rec.param(Param.FLEET_GPUS, ",".join(j for j in spec.gpus) or None)
        parent = tracker.log(parent_rec)
        progress(f"study {study.name!r}: {len(jobs)} job(s) ({len(spec.gpus) or 1} GPU type(s) x {len(study.arms)} "
                 f"arm(s)) on Ray, tracking {uri} (experiment {experiment!r}), max_retries {retries}")
        results = _drive(ray, study, jobs, retries, uri, experiment, parent.uuid, entry, progress, poll_s,
                         cancel_grace_s, tracker, parent)
        return FleetResult(study=study.name, experiment=experiment, tracking_uri=uri, parent_run_id=parent.run_id,
                           results=results)
    finally:
        if started_ray:
            ray.shutdown()


def _drive(ray: Any, study: Study, jobs: list[FleetJob], retries: int, uri: str, experiment: str,
           parent_uuid: str, entry: str, progress: Progress, poll_s: float, cancel_grace_s: float,
           tracker: Any, parent: Any) -> list[JobResult]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # the board lives on the driver's node: a worker node's loss must not take the progress view with it
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    board = ray.remote(num_cpus=0)(_Board).options(scheduling_strategy=here).remote()
    task = ray.remote(_arm_task)
    results = {j.key: JobResult(key=j.key, gpu=j.gpu, arm=j.arm.name) for j in jobs}
    by_key = {j.key: j for j in jobs}
    inflight: dict[Any, str] = {}
    running: dict[str, str] = {}  # job key -> node label
    done_on: dict[str, int] = {}  # node label -> jobs done there

    def submit(job: FleetJob) -> None:
        r = results[job.key]
        r.attempts += 1
        payload = {"job": job, "spec": parse_fleet(study), "study": study, "tracking_uri": uri,
                   "experiment": experiment, "parent_uuid": parent_uuid, "attempt": r.attempts,
                   "attempt_id": uuidlib.uuid4().hex, "entry": entry}
        ref = task.options(num_cpus=1, num_gpus=job.num_gpus, resources=job.resources or None,
                           max_retries=0, retry_exceptions=False).remote(payload, board)
        inflight[ref] = job.key

    def show() -> None:
        pending = sum(1 for r in results.values() if r.status == "PENDING") - len(running)
        per_node: dict[str, list[int]] = {}
        for node in running.values():
            per_node.setdefault(node, [0, 0])[0] += 1
        for node, n in done_on.items():
            per_node.setdefault(node, [0, 0])[1] += n
        nodes = " | ".join(f"{n}: running {v[0]}, done {v[1]}" for n, v in sorted(per_node.items()))
        progress(f"pending {max(pending, 0)} | {nodes}" if nodes else f"pending {max(pending, 0)}")

    def node_label(node_id: str, host: str | None) -> str:
        return f"{host or '?'}/{node_id[:8]}"

    for job in jobs:
        submit(job)
    show()
    parent_status = "FAILED"
    try:
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=poll_s)
            changed = False
            try:
                events = ray.get(board.drain.remote(), timeout=30)
            except ray.exceptions.RayError:  # progress is a view: losing it must not lose the study
                events = []
            for key, node_id, host, attempt in events:
                if results[key].status == "PENDING" and results[key].attempts == attempt:
                    running[key] = node_label(node_id, host)
                    results[key].nodes.append(node_id)
                    progress(f"[{running[key]}] {key}: running (attempt {attempt})")
                    changed = True
            for ref in ready:
                key = inflight.pop(ref)
                r, job = results[key], by_key[key]
                node = running.pop(key, None)
                try:
                    out = ray.get(ref)
                    if out.get("node_id") and out["node_id"] not in r.nodes:
                        r.nodes.append(out["node_id"])
                except ray.exceptions.TaskCancelledError:
                    r.status, r.error = "CANCELLED", "cancelled"
                except ray.exceptions.RayTaskError as exc:  # our task code raised: not a node failure
                    r.status, r.error = "FAILED", str(exc).strip().splitlines()[-1][:300]
                    _record_failed(study, job, r, tracker, experiment, parent_uuid)
                except ray.exceptions.RayError as exc:  # worker or node died: retry elsewhere
                    reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                    progress(f"[{node or '?'}] {key}: lost ({reason})")
                    still = not _missing_resources([job], ray)
                    if r.attempts <= retries and still:
                        progress(f"{key}: retrying ({r.attempts}/{retries} retries used)")
                        submit(job)
                    else:
                        why = "no node with its resources is left" if not still else f"{r.attempts} attempt(s)"
                        r.status, r.error = "FAILED", f"node lost after {why}: {reason}"
                        _record_failed(study, job, r, tracker, experiment, parent_uuid)
                else:
                    r.status = out.get("status") or "FAILED"
                    r.run_id, r.spooled, r.error = out.get("run_id"), out.get("spooled"), out.get("error")
                    r.hostname, r.gpu_name, r.gpu_source = out.get("hostname"), out.get("gpu_name"), out.get("gpu_source")
                    label = node or node_label(out.get("node_id", "?"), out.get("hostname"))
                    done_on[label] = done_on.get(label, 0) + 1
                    progress(f"[{label}] {key}: {r.status}" + (f" ({r.error})" if r.error else "")
                             + (f" -> run {r.run_id}" if r.run_id else ""))
                changed = True
            if changed:
                show()
        parent_status = "FINISHED" if all(r.status == "FINISHED" for r in results.values()) else "FAILED"
    except KeyboardInterrupt:
        parent_status = "KILLED"
        progress(f"interrupted: cancelling {len(inflight)} task(s); engines are stopped on their nodes")
        _cancel_all(ray, list(inflight), cancel_grace_s)
        for key in inflight.values():
            results[key].status, results[key].error = "CANCELLED", "interrupted"
        raise
    finally:
        with contextlib.suppress(Exception):
            tracker.finish(parent, parent_status)
        with contextlib.suppress(Exception):
            ray.kill(board)
    return [results[j.key] for j in jobs]


def _cancel_all(ray: Any, refs: list[Any], grace_s: float) -> None:
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)  # KeyboardInterrupt in the task: it stops its arm process
    if refs:
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)  # the worker dies; the arm process gets SIGTERM (parent-death signal)


def _record_failed(study: Study, job: FleetJob, r: JobResult, tracker: Any, experiment: str,
                   parent_uuid: str) -> None:
    """A job that never produced its own run: log a FAILED run with the reason and the nodes tried."""
    from quantrack.run.outcome import ArmOutcome
    from quantrack.run.record import record_for_arm

    node = {"hostname": r.hostname, "ray_node_id": r.nodes[-1] if r.nodes else None, "fleet_gpu": job.gpu,
            "gpu_source": GPU_FROM_CATALOG if job.gpu else None}
    narrowed = replace(study, gpu=replace(study.gpu, name=job.gpu)) if job.gpu else study
    out = ArmOutcome(arm=job.arm, status="FAILED", error=r.error, failed_step="fleet", node=node)
    rec = record_for_arm(narrowed, out, experiment=experiment, parent_uuid=parent_uuid)
    ctx = ArmContext(tracking_uri=tracker.uri, experiment=experiment, parent_uuid=parent_uuid, job_key=job.key,
                     attempt=r.attempts, attempt_id="driver", workdir=Path("."), progress=lambda _m: None)
    _fleet_params(rec, node, ctx)
    rec.param(Param.FLEET_NODES_TRIED, ",".join(n[:12] for n in r.nodes) or None)
    rec.tag(Tag.ERROR, r.error)
    logged = tracker.log(rec)
    r.run_id, r.spooled = logged.run_id, str(logged.spooled) if logged.spooled else None


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    sys.exit(_child_main(sys.argv[2], sys.argv[3]))
