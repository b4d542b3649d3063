"""A study's arms across a real multi-node Ray cluster, logged to a real `mlflow server` on PostgreSQL.

Real components: ``ray.cluster_utils.Cluster`` (head + 3 worker nodes, all on 127.0.0.1, custom resources
``gpu_type:H100`` x2 and ``gpu_type:A100-80GB`` standing for GPU types), llama.cpp servers via xllamacpp
serving SmolLM2-135M GGUF files (``quantrack.models.gguf.prepare_cpu_arms``), PostgreSQL + ``mlflow server``
(started by bench/mlflow_writers.py's helpers). Short latency settings, no eval: the machine has 2 cores.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

# Ray stays on loopback: tests/integration/conftest.py sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before any test
# module imports ray (Ray reads it once, at import); test_ray_reads_loopback_only_from_the_environment checks it.
ray = pytest.importorskip("ray")
pytest.importorskip("xllamacpp")
pytest.importorskip("psycopg2")
gguf_models = pytest.importorskip("quantrack.models.gguf")
psutil = pytest.importorskip("psutil")

from quantrack.errors import EnvironmentMissing, NotFound
from quantrack.fleet.ray_runner import GPU_FROM_CATALOG, run_study_on_ray
from quantrack.store.tracking import load_runs
from quantrack.study import load_study

REPO = Path(__file__).resolve().parents[2]
ENGINE_MODULE = "quantrack.engines.xllamacpp_server"
# engines started by this module carry this in their environment ([engine] env), so the leftover check
# sees only ours, not other tests' servers on the same machine
TAG = f"fleet-test-{os.getpid()}"


def _bench_helpers() -> Any:
    spec = importlib.util.spec_from_file_location("mlflow_writers", REPO / "bench" / "mlflow_writers.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("initdb") is None or shutil.which("postgres") is None:
        pytest.skip("PostgreSQL (initdb, postgres) not installed")
    h = _bench_helpers()
    work = tmp_path_factory.mktemp("mlflow-pg")
    pg = srv = None
    try:
        dsn, pg = h.start_postgres(work / "pg")
        uri, srv = h.start_mlflow_server(dsn, work, workers=1)
        yield uri
    finally:
        h.stop(srv)
        h.stop(pg)


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    try:
        return gguf_models.prepare_cpu_arms()
    except EnvironmentMissing as exc:
        pytest.skip(f"SmolLM2 GGUF files not available: {exc}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    assert ray_constants.ENABLE_RAY_CLUSTER is False, "ray was imported before conftest set its environment"
    small = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 * 1024**2}
    c = Cluster(initialize_head=True, head_node_args={**small, "num_cpus": 0, "include_dashboard": False})
    try:
        for gpu in ("H100", "H100", "A100-80GB"):
            c.add_node(**small, num_cpus=1, resources={f"gpu_type:{gpu}": 1})
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def test_ray_reads_loopback_only_from_the_environment() -> None:
    """A fresh interpreter (as a raylet or worker is) with our environment keeps Ray on 127.0.0.1."""
    import subprocess
    import sys

    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"
    code = "from ray._private import ray_constants as c; print(c.ENABLE_RAY_CLUSTER)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def _study(tmp_path: Path, models: dict[str, Path], name: str, arms: tuple[str, ...], max_retries: int,
           iterations: int = 3) -> Any:
    arm_tables = "\n".join(
        f'[[arms]]\nname = "{t.lower()}"\nweights = "{t.lower()}"\nmodel = "{models[t]}"\n' for t in arms)
    text = f"""
name = "{name}"
context_len = 512
[model]
gguf = "{models[arms[0]]}"
[engine]
kind = "llamacpp"
args = ["-t", "1"]
ready_timeout_s = 600
env = {{QUANTRACK_FLEET_TEST = "{TAG}"}}
[gpu]
name = "x86-cpu"
[latency]
input_tokens = 32
output_tokens = 8
warmup = 1
iterations = {iterations}
[fleet]
gpus = ["H100", "A100-80GB"]
resource = "gpu_type:{{gpu}}"
max_retries = {max_retries}
{arm_tables}
"""
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    return load_study(f)


def _engine_processes() -> list[Any]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if ENGINE_MODULE not in cmd:
            continue
        try:
            if p.environ().get("QUANTRACK_FLEET_TEST") == TAG:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def _engine_under(node: Any) -> bool:
    """Is one of our engines running under this Ray node's raylet (i.e. on that node)?"""
    from ray._private import ray_constants

    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    for p in _engine_processes():
        try:
            if raylet in {a.pid for a in p.parents()}:
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def _wait_no_engines(timeout: float = 30.0) -> list[Any]:
    deadline = time.time() + timeout
    left = _engine_processes()
    while left and time.time() < deadline:
        time.sleep(0.5)
        left = _engine_processes()
    return left


def test_arms_spread_over_nodes_one_run_each(cluster: Any, mlflow_uri: str, models: dict[str, Path],
                                             tmp_path: Path) -> None:
    from quantrack.report.audit import audit
    from quantrack.report.compare import compare_experiment, render

    study = _study(tmp_path, models, "fleet-spread", ("F16", "Q4_0"), max_retries=1)
    lines: list[str] = []
    res = run_study_on_ray(study, None, mlflow_uri, progress=lines.append)
    assert [r.status for r in res.results] == ["FINISHED"] * 4, res.results
    assert {r.key for r in res.results} == {"H100/f16", "H100/q4_0", "A100-80GB/f16", "A100-80GB/q4_0"}
    # progress named the nodes and their pending/running/done counts
    assert any(line.startswith("pending ") and "running" in line and "done" in line for line in lines)

    runs = load_runs(study.name, mlflow_uri)
    assert len(runs) == 4 and {r.status for r in runs} == {"FINISHED"}
    assert {r.params["fleet_gpu"] for r in runs} == {"H100", "A100-80GB"}
    assert len({r.params["ray_node_id"] for r in runs}) >= 2  # really spread over nodes
    assert {r.params["gpu_source"] for r in runs} == {GPU_FROM_CATALOG}
    assert {r.params["gpu_name"] for r in runs} == {"H100-SXM", "A100-80GB"}
    assert all(r.params.get("hostname") for r in runs)
    a100 = [r for r in runs if r.params["fleet_gpu"] == "A100-80GB"]
    assert len({r.params["ray_node_id"] for r in a100}) == 1  # only one node offers gpu_type:A100-80GB
    assert all(r.metrics.get("ttft_ms_median", r.metrics.get("ttft_median_ms", 0)) >= 0 for r in runs)

    table = render(compare_experiment(study.name, uri=mlflow_uri))
    assert "f16" in table and "q4_0" in table
    report = audit([study.name], uri=mlflow_uri)
    assert len(report.rows) == 4
    assert _wait_no_engines() == []


def test_node_removed_mid_arm_is_retried_or_failed(cluster: Any, mlflow_uri: str, models: dict[str, Path],
                                                   tmp_path: Path) -> None:
    try:  # the runs the first test logged (when run alone: none)
        earlier = {r.run_id for r in load_runs("fleet-spread", mlflow_uri)}
    except NotFound:
        earlier = set()
    study = _study(tmp_path, models, "fleet-node-loss", ("Q4_0",), max_retries=1, iterations=60)
    by_id = {n.node_id: n for n in cluster.worker_nodes}
    removed: list[str] = []

    def progress(line: str) -> None:
        # "[host/abcd1234] H100/q4_0: running (attempt 1)": kill that node while the arm runs
        if ": running (attempt 1)" in line and len(removed) < 2:
            prefix = line.split("/", 1)[1].split("]", 1)[0]
            node = next(n for nid, n in by_id.items() if nid.startswith(prefix))
            deadline = time.time() + 120
            while not _engine_under(node) and time.time() < deadline:  # kill it with its engine up
                time.sleep(0.2)
            assert _engine_under(node), "the arm's engine never started on its node"
            cluster.remove_node(node)
            removed.append(line)

    res = run_study_on_ray(study, None, mlflow_uri, progress=progress)
    by_key = {r.key: r for r in res.results}
    h100, a100 = by_key["H100/q4_0"], by_key["A100-80GB/q4_0"]
    # H100: two nodes offer it, so the arm was retried on the other one and finished
    assert h100.status == "FINISHED" and h100.attempts == 2 and len(set(h100.nodes)) == 2
    # A100-80GB: its only node is gone, so the arm is recorded FAILED with the reason
    assert a100.status == "FAILED" and "no node with its resources is left" in (a100.error or "")
    runs = load_runs(study.name, mlflow_uri)
    failed = [r for r in runs if r.params.get("fleet_gpu") == "A100-80GB" and r.status == "FAILED"]
    assert failed and "node lost" in failed[0].tags.get("quantrack.error", "")
    finished = [r for r in runs if r.params.get("fleet_gpu") == "H100" and r.status == "FINISHED"]
    assert len(finished) == 1 and finished[0].params["fleet_attempt"] == "2"
    # nothing already logged is lost
    assert not earlier or earlier <= {r.run_id for r in load_runs("fleet-spread", mlflow_uri)}
    assert _wait_no_engines() == []
