"""Time `quantrack audit --logs DIR` over a fleet of node logs built from real startup logs.

    python bench/audit_fleet.py [--nodes 1000] [--kb 50] [--runs 3] [--cpus 0,1]

Each node log is one real startup log (the H200 vLLM 0.25 / SGLang 0.5.16 logs and the xllamacpp CPU logs of the
reference data, or a public excerpt from tests/data/public-logs/), followed by that log's own last lines repeated
until the file is --kb KiB (a node keeps serving after start-up). The audit runs in a fresh process (import and
CLI start-up included) pinned to --cpus with taskset when it exists, --format json. Checked before a time is
printed: every node whose source log holds a fallback is flagged, no other node is, and none is unknown.
Results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SOURCES = [*sorted((SHARED / "vllm-h200").glob("vllm-0.25.0-*.log")),
           *sorted((SHARED / "sglang-h200").glob("sglang-0.5.16-*.log")),
           *sorted((SHARED / "llamacpp-cpu").glob("xllamacpp-*.log")),
           REPO / "tests" / "data" / "public-logs" / "vllm-jimw-v064-turing-opt125m-xformers.log"]
FALLBACK_SOURCES = {"vllm-0.25.0-fp8marlin.log", "sglang-0.5.16-fp8marlin.log",
                    "vllm-jimw-v064-turing-opt125m-xformers.log"}


def build(directory: Path, nodes: int, kib: int) -> tuple[int, set[str]]:
    srcs = [p for p in SOURCES if p.is_file()]
    if not srcs:
        raise SystemExit("no source logs found (the reference data under ../shared/data)")
    total, fell = 0, set()
    target = kib * 1024
    for i in range(nodes):
        src = srcs[i % len(srcs)]
        body = src.read_bytes()
        if not body.endswith(b"\n"):
            body += b"\n"
        tail = b"\n".join(body.rstrip(b"\n").split(b"\n")[-20:]) + b"\n"
        parts = [body]
        size = len(body)
        while size < target:
            parts.append(tail)
            size += len(tail)
        name = f"node-{i:04d}-{src.name}"
        (directory / name).write_bytes(b"".join(parts))
        total += size
        if src.name in FALLBACK_SOURCES:
            fell.add(name)
    return total, fell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--kb", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cpus", default="0,1", help="taskset CPU list ('' = no pinning)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="quantrack-fleet-"))
    try:
        size, fell = build(tmp, args.nodes, args.kb)
        # the H200 logs name no GPU and SGLang's prints no FP8 kernel line: without the fleet's GPU their FP8 nodes
        # are unknown, not clean (the FP8 gate); --gpu changes nothing for the CPU and the fp16 Turing logs
        cmd = [sys.executable, "-m", "quantrack", "audit", "--logs", str(tmp), "--gpu", "H200", "--format", "json"]
        if args.cpus and shutil.which("taskset"):
            cmd = ["taskset", "-c", args.cpus, *cmd]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            times.append(time.perf_counter() - t0)
            if res.returncode not in (0, 4, 5):
                print(res.stderr, file=sys.stderr)
                return 1
            data = json.loads(res.stdout)
            if set(data["fell_back"]) != fell or data["unknown"]:
                print(f"wrong audit: {len(data['fell_back'])} flagged (want {len(fell)}), "
                      f"{len(data['unknown'])} unknown", file=sys.stderr)
                return 1
        print(f"nodes {args.nodes}, {size / 1e6:.1f} MB in all ({len(fell)} with a fallback, all flagged, 0 unknown)")
        print(f"audit --logs: best {min(times):.2f} s, median {statistics.median(times):.2f} s over {args.runs} runs "
              f"(fresh process{', taskset -c ' + args.cpus if 'taskset' in cmd[0] else ''})")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
