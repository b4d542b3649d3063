"""Cold-start wall time of `quantrack --help` and `quantrack preflight --gpu H100 --arm fp8`.

Median of N runs, each timed with time.perf_counter() around subprocess.run. Targets: <= 0.3 s and
<= 0.5 s. The console script next to this interpreter is used (a pyenv shim would add its own
start-up); `--python-m` times `python -m quantrack` instead.

    python bench/cold_start.py [-n 15] [--python-m]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = (("--help", ["--help"], 0.3), ("preflight --gpu H100 --arm fp8", ["preflight", "--gpu", "H100", "--arm", "fp8"], 0.5))


def command(python_m: bool) -> list[str]:
    if python_m:
        return [sys.executable, "-m", "quantrack"]
    script = Path(sys.executable).with_name("quantrack")
    found = str(script) if script.exists() else shutil.which("quantrack")
    if not found:
        raise SystemExit("quantrack console script not found; pip install -e . first")
    return [found]


def time_once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=15, help="runs per command (default 15)")
    ap.add_argument("--python-m", action="store_true", help="time `python -m quantrack` instead of the script")
    args = ap.parse_args()
    base = command(args.python_m)
    print(f"command: {' '.join(base)}; runs: {args.n} (+1 warm-up, discarded); python {sys.version.split()[0]}")
    print("| command | median s | min s | max s | target s | within target |")
    print("|---|---|---|---|---|---|")
    for label, extra, target in CASES:
        time_once(base + extra)  # warm the page cache / .pyc files
        times = [time_once(base + extra) for _ in range(args.n)]
        med = statistics.median(times)
        print(f"| `quantrack {label}` | {med:.3f} | {min(times):.3f} | {max(times):.3f} | {target} | "
              f"{'yes' if med <= target else 'NO'} |")


if __name__ == "__main__":
    main()
