"""`quantrack report` over 1,000 runs: target <= 5 s for a fresh process (what a user runs), figures included.

Uses the store of bench/compare_1000_runs.py (built once and cached there: the four real H200 vLLM arms from
../shared/data/vllm-h200, logged as `quantrack log` does, over 250 node hostnames, bf16 and fp8 with real
per-question GSM8K records). Then times, as fresh processes (imports included, `--cli-runs` times each):

* ``quantrack report --experiment bench-compare-1000 --slo 'tpot_p50<=20ms@64' --slo 'ttft_p50<=2s@64'
  --max-accuracy-drop 1pp --out <tmp>/report.html`` (HTML, 7 figures embedded);
* the same with ``--format md`` (PNGs written beside it);
* the library call ``decision_report`` + ``to_html`` in this process (imports warm), 5x.

    python bench/report_1000_runs.py [--runs 1000] [--store DIR] [--cli-runs 7]

Prints medians; recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
EXPERIMENT = "bench-compare-1000"
SLOS = ("tpot_p50<=20ms@64", "ttft_p50<=2s@64")


def _line(what: str, xs: list[float]) -> str:
    return (f"{what}: median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f}, "
            f"{len(xs)} runs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--store", default=str(REPO / ".quantrack-cache" / "bench-compare-1000"))
    ap.add_argument("--cli-runs", type=int, default=7, help="fresh processes per format (>= 5)")
    args = ap.parse_args()
    store = Path(args.store)
    store.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store}/mlflow.db"
    marker = store / f"built-{args.runs}"
    if not marker.exists():
        from compare_1000_runs import build_store  # type: ignore[import-not-found]

        print(f"building {args.runs} runs in {uri} (once)", file=sys.stderr)
        build_store(uri, args.runs)
        marker.write_text("ok\n")

    from quantrack.constraints import Constraints, parse_accuracy_drop, parse_slo
    from quantrack.report.decision import decision_report
    from quantrack.report.page import to_html
    from quantrack.store.tracking import load_runs

    n = len(load_runs(EXPERIMENT, uri))
    load0 = os.getloadavg()[0]
    cli: dict[str, list[float]] = {"html": [], "md": []}
    first: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        for _ in range(args.cli_runs):
            for fmt in ("html", "md"):
                out = Path(tmp) / f"report.{fmt}"
                argv = [sys.executable, "-m", "quantrack.cli", "report", "--experiment", EXPERIMENT,
                        "--tracking-uri", uri, "--max-accuracy-drop", "1pp", "--out", str(out), "--format", fmt]
                for s in SLOS:
                    argv += ["--slo", s]
                t0 = time.perf_counter()
                proc = subprocess.run(argv, check=True, capture_output=True, text=True)
                cli[fmt].append(time.perf_counter() - t0)
                first.setdefault(fmt, proc.stdout)
        size = (Path(tmp) / "report.html").stat().st_size
        pngs = len(list(Path(tmp).glob("report-*.png")))
    c = Constraints(slos=tuple(parse_slo(s) for s in SLOS), max_accuracy_drop=parse_accuracy_drop("1pp"))
    to_html(decision_report(EXPERIMENT, c, uri=uri))  # warm: imports
    lib = []
    for _ in range(5):
        t0 = time.perf_counter()
        to_html(decision_report(EXPERIMENT, c, uri=uri))
        lib.append(time.perf_counter() - t0)
    print(first["html"])
    print(f"runs in experiment: {n}; HTML page {size:,} bytes; md: {pngs} PNGs beside it")
    for fmt in ("html", "md"):
        print(_line(f"CLI fresh process, sqlite, --format {fmt}", cli[fmt]))
    print(_line("library decision_report + to_html, in-process", lib))
    print(f"load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
