"""How many arm runs per second one `mlflow server` on PostgreSQL accepts from concurrent writers.

Each writer is a process that logs runs the way a fleet node does (``quantrack.store.tracking.Tracker.log``:
create run, one batch of ~30 metrics + params + tags, one text artifact, terminate). Writers import
mlflow and connect first, then start together at a barrier; the clock runs from the barrier to the
last writer's end.

    python bench/mlflow_writers.py --writers 1,4,16,32 --runs-per-writer 4            # starts PG + server
    python bench/mlflow_writers.py --tracking-uri http://host:5000 --writers 1,4,16    # an existing server

Prints one JSON line per N and a table. Results recorded in docs/fleet.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the postgres user when we are root."""
    if os.geteuid() == 0 and shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def start_postgres(workdir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth); returns (DSN of db 'mlflow', process)."""
    if os.geteuid() == 0:  # the postgres user must reach the data dir: not under a root-only 0700 temp dir
        workdir = Path(tempfile.mkdtemp(prefix="qt-pg-"))
        os.chmod(workdir, 0o755)
        shutil.chown(workdir, "postgres", "postgres")
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "pgdata"
    subprocess.run(_as_postgres(["initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True)
    port = free_port()
    log = open(workdir / "postgres.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(_as_postgres(["postgres", "-D", str(data), "-p", str(port), "-h", "127.0.0.1",
                                          "-k", str(workdir), "-c", "max_connections=200", "-c", "fsync=on"]),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.cleanup_dir = workdir  # type: ignore[attr-defined]  # removed by stop()
    import psycopg2

    deadline = time.time() + 300  # far above the quiet start (~2 s): the suite runs this beside CPU burners
    while True:
        try:
            conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
            break
        except psycopg2.OperationalError:
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"postgres did not start; see {workdir / 'postgres.log'}") from None
            time.sleep(0.3)
    conn.autocommit = True
    conn.cursor().execute("CREATE DATABASE mlflow")
    conn.close()
    return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/mlflow", proc


def start_mlflow_server(dsn: str, workdir: Path, workers: int = 2) -> tuple[str, subprocess.Popen[bytes]]:
    """`mlflow server` on the DSN with proxied artifact storage under workdir; returns (http URI, process)."""
    import httpx

    port = free_port()
    log = open(workdir / "mlflow-server.log", "wb")  # noqa: SIM115
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", dsn, "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers), "--serve-artifacts",
            "--artifacts-destination", str(workdir / "artifacts")]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600  # far above the quiet start (~10 s): >120 s was seen on a loaded 2-core machine
    while time.time() < deadline:
        if proc.poll() is not None:
            tail = (workdir / "mlflow-server.log").read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError("mlflow server exited: " + " | ".join(tail))
        try:
            if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                return uri, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("mlflow server did not become healthy in 180 s")


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    """Stop a server started here (its whole session) and remove its scratch directory, if any."""
    if proc is None:
        return
    try:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
    finally:
        cleanup = getattr(proc, "cleanup_dir", None)
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)


def _record(experiment: str, writer: int, i: int, n_metrics: int, artifact_bytes: int) -> Any:
    from quantrack.store.records import RunRecord

    rec = RunRecord(experiment=experiment, run_name=f"w{writer}-r{i}")
    for k in range(10):
        rec.param(f"param_{k}", f"value-{writer}-{i}-{k}")
    for k in range(n_metrics):
        rec.metric(f"metric_{k}", float(writer * 1000 + i * 10 + k))
    rec.tag("quantrack.role", "arm")
    rec.artifacts["bench/server.log"] = ("x" * 99 + "\n") * max(1, artifact_bytes // 100)
    return rec


def _writer(uri: str, experiment: str, writer: int, runs: int, n_metrics: int, artifact_bytes: int,
            barrier: Any, out: Any) -> None:
    from quantrack.store.tracking import Tracker

    os.environ["QUANTRACK_SPOOL_DIR"] = tempfile.mkdtemp(prefix="qt-spool-")
    tracker = Tracker(uri, experiment)
    tracker.log(_record(experiment, writer, -1, 1, 100))  # connect + experiment lookup outside the clock
    records = [_record(experiment, writer, i, n_metrics, artifact_bytes) for i in range(runs)]
    barrier.wait()
    t0 = time.perf_counter()
    lat, ok = [], 0
    for rec in records:
        s = time.perf_counter()
        logged = tracker.log(rec)
        lat.append(time.perf_counter() - s)
        ok += 1 if logged.run_id else 0
    out.put({"writer": writer, "start": t0, "end": time.perf_counter(), "lat": lat, "ok": ok})


def measure(uri: str, n: int, runs: int, n_metrics: int, artifact_bytes: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(n + 1)
    q = ctx.Queue()
    experiment = f"bench-writers-{n}-{int(time.time())}"
    from quantrack.store.tracking import Tracker

    Tracker(uri, experiment).log(_record(experiment, 0, -2, 1, 100))  # create the experiment once
    procs = [ctx.Process(target=_writer, args=(uri, experiment, w, runs, n_metrics, artifact_bytes, barrier, q))
             for w in range(n)]
    for p in procs:
        p.start()
    barrier.wait(timeout=600)
    t0 = time.perf_counter()
    results = [q.get(timeout=900) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    lat = sorted(x for r in results for x in r["lat"])
    ok = sum(r["ok"] for r in results)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))]

    return {"writers": n, "runs": n * runs, "logged_on_server": ok, "wall_s": round(wall, 2),
            "runs_per_s": round(n * runs / wall, 2), "p50_s": round(pct(0.5), 3), "p95_s": round(pct(0.95), 3),
            "max_s": round(lat[-1], 3), "metrics_per_run": n_metrics, "artifact_bytes": artifact_bytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", default="1,4,16,32")
    ap.add_argument("--runs-per-writer", type=int, default=4)
    ap.add_argument("--metrics", type=int, default=30)
    ap.add_argument("--artifact-bytes", type=int, default=20_000)
    ap.add_argument("--tracking-uri", help="an existing server; default: start PostgreSQL + mlflow server here")
    ap.add_argument("--server-workers", type=int, default=2)
    args = ap.parse_args()
    levels = [int(x) for x in args.writers.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="qt-bench-mlflow-"))
    pg = srv = None
    try:
        uri = args.tracking_uri
        if not uri:
            dsn, pg = start_postgres(workdir / "pg")
            uri, srv = start_mlflow_server(dsn, workdir, workers=args.server_workers)
        print(f"# server {uri}  cpu cores {os.cpu_count()}  server workers {args.server_workers}", flush=True)
        rows = []
        for n in levels:
            row = measure(uri, n, args.runs_per_writer, args.metrics, args.artifact_bytes)
            rows.append(row)
            print(json.dumps(row), flush=True)
        print("\n| writers | runs | runs/s (measured) | p50 s/run | p95 s/run | max s |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['writers']} | {r['runs']} | {r['runs_per_s']} | {r['p50_s']} | {r['p95_s']} | {r['max_s']} |")
    finally:
        stop(srv)
        stop(pg)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
