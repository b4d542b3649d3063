"""Helpers to start and stop real local services for the tracking tests: an ``mlflow server`` on 127.0.0.1
(SQLite or PostgreSQL backend, artifacts served by the server) and a private PostgreSQL cluster.

Import from tests: ``from tests.integration.mlflow_fixtures import MlflowServer, PostgresCluster``.
Everything listens on 127.0.0.1 only, lives in a temp dir and is stopped by the caller (context managers).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import httpx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlflowServer:
    """``mlflow server --host 127.0.0.1 --port P --backend-store-uri B --artifacts-destination D``."""

    def __init__(self, backend_uri: str, artifacts_dir: Path, log_path: Path, port: int | None = None,
                 workers: int = 1, env: dict[str, str] | None = None) -> None:
        self.backend_uri = backend_uri
        self.artifacts_dir = artifacts_dir
        self.log_path = log_path
        self.port = port or free_port()
        self.workers = workers
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # far above the quiet start (~10 s): beside a CPU burner and the rest of the suite (load 10-14 on two cores)
    # an `mlflow server` took more than 120 s to answer /health
    def start(self, timeout: float = 600.0) -> MlflowServer:
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--backend-store-uri", self.backend_uri, "--serve-artifacts",
                "--artifacts-destination", str(self.artifacts_dir), "--workers", str(self.workers)]
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(self.extra_env)
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed when the process is reaped
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"mlflow server not healthy after {timeout:.0f} s; log: {self.log_path}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- reading back through the REST API the UI uses ------------------------------------------------
    def search_runs(self, experiment_name: str) -> list[dict]:
        exp = httpx.get(self.url + "/api/2.0/mlflow/experiments/get-by-name",
                        params={"experiment_name": experiment_name}, timeout=30).json()["experiment"]
        runs: list[dict] = []
        token = None
        while True:
            body = {"experiment_ids": [exp["experiment_id"]], "max_results": 1000}
            if token:
                body["page_token"] = token
            data = httpx.post(self.url + "/api/2.0/mlflow/runs/search", json=body, timeout=60).json()
            runs += data.get("runs", [])
            token = data.get("next_page_token")
            if not token:
                return runs

    def list_artifacts(self, run_id: str, path: str | None = None) -> list[str]:
        """All artifact file paths of a run (recursive)."""
        params = {"run_id": run_id}
        if path:
            params["path"] = path
        data = httpx.get(self.url + "/api/2.0/mlflow/artifacts/list", params=params, timeout=30).json()
        out: list[str] = []
        for f in data.get("files", []):
            if f.get("is_dir"):
                out += self.list_artifacts(run_id, f["path"])
            else:
                out.append(f["path"])
        return sorted(out)

    def metric_history(self, run_id: str, key: str) -> list[dict]:
        data = httpx.get(self.url + "/api/2.0/mlflow/metrics/get-history",
                         params={"run_id": run_id, "metric_key": key}, timeout=30).json()
        return sorted(data.get("metrics", []), key=lambda m: m["step"])


def run_fields(run: dict) -> dict:
    """A REST run as comparable plain data: params, metrics, tags, status, times."""
    data = run.get("data", {})
    return {
        "name": run["info"].get("run_name"),
        "status": run["info"]["status"],
        "start_time": int(run["info"]["start_time"]),
        "end_time": int(run["info"].get("end_time") or 0),
        "params": {p["key"]: p["value"] for p in data.get("params", [])},
        "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])},
        "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
    }


def postgres_bin() -> Path | None:
    """Debian's PostgreSQL binaries (apt-get install postgresql), newest version first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(found[0]).parent if found else None


class PostgresCluster:
    """A private cluster in a temp dir on 127.0.0.1:PORT (run as ``postgres`` when we are root)."""

    def __init__(self, root: Path | None = None, port: int | None = None) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise FileNotFoundError("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin "
                                    "(apt-get install postgresql; scripts/ci-system-deps.sh)")
        self.bin = bindir
        # pytest's tmp dirs are private to root (0700): the postgres user could not enter them
        self.root = root or Path(tempfile.mkdtemp(prefix="quantrack-pg-"))
        self.data = self.root / "pgdata"
        self.sock = self.root / "sock"
        self.port = port or free_port()
        self.user = "quantrack"
        self.as_postgres = os.geteuid() == 0

    def _run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        if self.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/mlflow"

    def start(self) -> PostgresCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.sock.mkdir(exist_ok=True)
        if self.as_postgres:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sock, "postgres")
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust",
                   "-E", "UTF8", "--no-sync"])
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "pg.log"), "-w",
                   "-o", f"-k {self.sock} -h 127.0.0.1 -p {self.port} -c max_connections=200 -c fsync=off",
                   "start"])
        self._run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "mlflow"])
        return self

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
