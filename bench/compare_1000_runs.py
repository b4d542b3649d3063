"""`quantrack compare` over 1,000 runs: target <= 2 s for a fresh process (what a user runs).

Builds (once, cached) a local SQLite store with 1,000 arm runs in one experiment: the four real H200 vLLM
arms (../shared/data/vllm-h200 logs + latency JSON, logged exactly as `quantrack log` would) repeated over
250 "nodes" (hostname param node-000 ..), plus per-question GSM8K outcomes from the real llama.cpp records
(tests/data/eval/smol-q41-max24.jsonl) on the bf16 and fp8 arms so the paired test runs. Then times, for
each store reader (``auto``: quantrack.store.direct, no mlflow import; ``mlflow``: one mlflow.search_runs):

* CLI: ``quantrack compare --experiment ...`` as a fresh process (imports included), ``--cli-runs`` times,
  readers interleaved, and checks that both readers print the same bytes;
* library: ``compare_experiment`` + ``render`` in this process, 5x (mlflow already imported for ``mlflow``);
* with ``--http``: the same CLI against a real ``mlflow server`` on 127.0.0.1 serving that store.

    python bench/compare_1000_runs.py [--runs 1000] [--store DIR] [--cli-runs 7] [--http]

Prints medians; recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO / "tests" / "data" / "real" / "vllm-h200"  # the real H200 files, vendored (tests/data/real/README.md)
EXPERIMENT = "bench-compare-1000"


def build_store(uri: str, n_runs: int) -> None:
    from quantrack.engines import get_adapter
    from quantrack.runner import (
        ArmOutcome,
        load_eval,
        load_latency_row,
        record_for_arm,
        step_predict,
    )
    from quantrack.store.tracking import _client, experiment_id, upload
    from quantrack.study import load_study

    study = load_study(REPO / "tests" / "data" / "tracking" / "vllm-h200.toml")
    records = REPO / "tests" / "data" / "eval" / "smol-q41-max24.jsonl"
    base: dict[str, ArmOutcome] = {}
    for arm in ("bf16", "fp8", "fp8kv", "fp8marlin"):
        out = ArmOutcome(arm=study.arm(arm), status="FINISHED", source="log")
        out.latency_row = load_latency_row(SHARED / f"client-latency-{arm}.json")
        out.log_report = get_adapter("vllm").parse_log_file(SHARED / f"vllm-0.25.0-{arm}.log")
        out.predicted = step_predict(study, out.arm, {})
        if arm in ("bf16", "fp8"):
            out.eval, out.eval_records = load_eval(records)
        base[arm] = out
    client = _client(uri)
    exp = experiment_id(client, EXPERIMENT, uri)
    assert exp is not None
    t0 = time.perf_counter()
    for i in range(n_runs):
        arm = ("bf16", "fp8", "fp8kv", "fp8marlin")[i % 4]
        out = base[arm]
        out.node = {"hostname": f"node-{i // 4:03d}"}
        rec = record_for_arm(study, out, experiment=EXPERIMENT)
        rec.artifacts.clear()
        rec.artifact_files.clear()
        upload(client, exp, rec, None)
        if (i + 1) % 100 == 0:
            print(f"  built {i + 1}/{n_runs} runs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)


def _time_cli(uri: str, readers: tuple[str, ...], runs: int) -> tuple[dict[str, list[float]], dict[str, bytes]]:
    times: dict[str, list[float]] = {r: [] for r in readers}
    outputs: dict[str, bytes] = {}
    argv = [sys.executable, "-m", "quantrack.cli", "compare", "--experiment", EXPERIMENT, "--tracking-uri", uri]
    for _ in range(runs):
        for reader in readers:  # interleaved: load changes hit both alike
            env = {**os.environ, "QUANTRACK_STORE_READER": reader}
            t0 = time.perf_counter()
            out = subprocess.run(argv, check=True, capture_output=True, env=env)
            times[reader].append(time.perf_counter() - t0)
            if outputs.setdefault(reader, out.stdout) != out.stdout:
                raise SystemExit(f"reader {reader}: output changed between runs")
    return times, outputs


def _line(what: str, xs: list[float]) -> str:
    return (f"{what}: median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f}, "
            f"{len(xs)} runs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--store", default=str(REPO / ".quantrack-cache" / "bench-compare-1000"))
    ap.add_argument("--cli-runs", type=int, default=7, help="fresh processes per reader (>= 5)")
    ap.add_argument("--http", action="store_true", help="also time against a real mlflow server (127.0.0.1)")
    args = ap.parse_args()
    store = Path(args.store)
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store}/mlflow.db"
    marker = store / f"built-{args.runs}"
    if not marker.exists():
        print(f"building {args.runs} runs in {uri} (once)", file=sys.stderr)
        build_store(uri, args.runs)
        marker.write_text("ok\n")

    from quantrack.report.compare import compare_experiment, render
    from quantrack.store.tracking import load_runs

    readers = ("auto", "mlflow")
    load0 = os.getloadavg()[0]
    cli, outputs = _time_cli(uri, readers, args.cli_runs)
    if outputs["auto"] != outputs["mlflow"]:
        raise SystemExit("FIDELITY: the two readers printed different tables")
    n = len(load_runs(EXPERIMENT, uri))
    lib: dict[str, list[float]] = {r: [] for r in readers}
    for reader in readers:
        os.environ["QUANTRACK_STORE_READER"] = reader
        render(compare_experiment(EXPERIMENT, None, uri), "table")  # warm: imports
        for _ in range(5):
            t0 = time.perf_counter()
            render(compare_experiment(EXPERIMENT, None, uri), "table")
            lib[reader].append(time.perf_counter() - t0)
    os.environ.pop("QUANTRACK_STORE_READER")
    http: dict[str, list[float]] = {}
    if args.http:
        import tempfile

        from tests.integration.mlflow_fixtures import MlflowServer

        with tempfile.TemporaryDirectory(prefix="bench-compare-http-") as tmp:
            server = MlflowServer(uri, Path(tmp) / "artifacts", Path(tmp) / "server.log").start()
            try:
                http, http_out = _time_cli(server.url, readers, args.cli_runs)
            finally:
                server.stop()
        if http_out["auto"] != outputs["auto"] or http_out["mlflow"] != outputs["auto"]:
            raise SystemExit("FIDELITY: the tables read over HTTP differ from the SQLite ones")
    print(outputs["auto"].decode())
    print(f"runs in experiment: {n}; both readers printed identical bytes"
          + (" (SQLite and HTTP)" if args.http else ""))
    for reader in readers:
        print(_line(f"CLI fresh process, sqlite, reader={reader}", cli[reader]))
    for reader in http:
        print(_line(f"CLI fresh process, mlflow server over HTTP, reader={reader}", http[reader]))
    for reader in readers:
        print(_line(f"library compare_experiment+render, reader={reader}", lib[reader]))
    print(f"load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
