"""`quantrack compare` over 1,000 runs: target <= 2 s (one mlflow.search_runs call, no per-run requests).

Builds (once, cached) a local SQLite store with 1,000 arm runs in one experiment: the four real H200 vLLM
arms (../shared/data/vllm-h200 logs + latency JSON, logged exactly as `quantrack log` would) repeated over
250 "nodes" (hostname param node-000 ..), plus per-question GSM8K outcomes from the real llama.cpp records
(tests/data/eval/smol-q41-max24.jsonl) on the bf16 and fp8 arms so the paired test runs. Then times:

* library: ``compare_experiment`` (load_runs = one search_runs, build_table, render) in this process, 5x;
* CLI: ``quantrack compare --experiment ...`` as a fresh process (imports included), 3x.

    python bench/compare_1000_runs.py [--runs 1000] [--store DIR]

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
SHARED = Path(os.environ.get("QUANTRACK_SHARED", REPO.parent / "shared")) / "data" / "vllm-h200"
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
    from quantrack.study import load_study
    from quantrack.tracking import _client, experiment_id, upload

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--store", default=str(REPO / ".quantrack-cache" / "bench-compare-1000"))
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
    from quantrack.tracking import load_runs

    n = len(load_runs(EXPERIMENT, uri))
    lib = []
    for _ in range(5):
        t0 = time.perf_counter()
        text = render(compare_experiment(EXPERIMENT, None, uri), "table")
        lib.append(time.perf_counter() - t0)
    cli = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "quantrack.cli", "compare", "--experiment", EXPERIMENT,
                        "--tracking-uri", uri], check=True, capture_output=True)
        cli.append(time.perf_counter() - t0)
    print(text)
    load = os.getloadavg()[0]
    print(f"runs in experiment: {n}")
    print(f"library compare_experiment+render: median {statistics.median(lib):.3f} s "
          f"(min {min(lib):.3f}, max {max(lib):.3f}, 5 runs)")
    print(f"CLI `quantrack compare` (fresh process): median {statistics.median(cli):.3f} s "
          f"(min {min(cli):.3f}, max {max(cli):.3f}, 3 runs); load average {load:.1f}")


if __name__ == "__main__":
    main()
