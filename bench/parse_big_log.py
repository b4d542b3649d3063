"""Time the streaming log parser on a big log built by repeating a real one.

    python bench/parse_big_log.py [--log tests/data/real/vllm-h200/vllm-0.25.0-fp8marlin.log] [--mb 50] [--runs 3]

Writes the big log to a temp file, parses it with the engine's adapter (file read + parse,
line by line), prints the best and median wall time over --runs, the figures found, and the process's peak
resident memory (getrusage ru_maxrss): the parser streams, so it stays flat whatever --mb is.
Results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOG = REPO / "tests" / "data" / "real" / "vllm-h200" / "vllm-0.25.0-fp8marlin.log"


def build(src: Path, target_mb: float, dst: Path) -> int:
    chunk = src.read_bytes()
    if not chunk.endswith(b"\n"):
        chunk += b"\n"
    target = int(target_mb * 1024 * 1024)
    with open(dst, "wb") as out:
        written = 0
        while written < target:
            out.write(chunk)
            written += len(chunk)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG)
    ap.add_argument("--mb", type=float, default=50.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", default="auto")
    args = ap.parse_args(argv)
    if not args.log.is_file():
        print(f"log not found: {args.log}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from quantrack.engines import parse_log_file

    fd, tmp = tempfile.mkstemp(prefix="quantrack-biglog-", suffix=".log")
    os.close(fd)
    try:
        size = build(args.log, args.mb, Path(tmp))
        times = []
        report = None
        for _ in range(args.runs):
            t0 = time.perf_counter()
            report = parse_log_file(tmp, args.engine, strict=False)  # many copies: many runs, kept (strict refuses)
            times.append(time.perf_counter() - t0)
        assert report is not None
        print(f"source: {args.log.name} repeated to {size / 1024 / 1024:.1f} MiB "
              f"({report.extra.get('lines_read')} lines)")
        print(f"parse time: best {min(times):.2f} s, median {statistics.median(times):.2f} s over {args.runs} runs "
              f"({size / 1024 / 1024 / min(times):.0f} MiB/s)")
        print(f"engine {report.engine}; kv_cache_tokens {report.kv_cache_tokens}; weights_gib {report.weights_gib}; "
              f"fallbacks {[(e.kind, e.line_no) for e in report.fallbacks]}")
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        print(f"peak resident memory of this process: {peak:.0f} MiB (file {size / 1024 / 1024:.0f} MiB)")
    finally:
        os.unlink(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
