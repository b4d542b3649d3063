"""What the typed study schema costs: reading and validating a study, and importing the schema module.

- ``load_study`` of each example study: median and min of N in-process loads (parse TOML + validate every key).
- import time in fresh interpreters (min and median of N): ``quantrack.settings`` (with the package), ``quantrack.study``
  (with what it imports), and ``pydantic.BaseModel`` for comparison (the library not chosen).

    python bench/study_load.py [-n 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPORTS = {
    "import quantrack.settings": "import quantrack.settings",
    "import quantrack.study": "import quantrack.study",
    "from pydantic import BaseModel": "from pydantic import BaseModel",
}


def load_times(n: int) -> list[tuple[str, float, float]]:
    from quantrack.study import load_study

    out = []
    for path in sorted((REPO / "examples").rglob("*.toml")):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            load_study(path)
            ts.append(time.perf_counter() - t)
        out.append((str(path.relative_to(REPO)), statistics.median(ts) * 1e3, min(ts) * 1e3))
    return out


def import_times(n: int) -> list[tuple[str, float, float]]:
    out = []
    for label, stmt in IMPORTS.items():
        code = f"import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
        ts = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                   cwd=REPO).stdout) for _ in range(n)]
        out.append((label, statistics.median(ts) * 1e3, min(ts) * 1e3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=15)
    n = ap.parse_args().n
    print(f"python {sys.version.split()[0]}; {n} runs each")
    print("| load_study | median ms | min ms |\n|---|---|---|")
    for name, med, lo in load_times(n):
        print(f"| `{name}` | {med:.2f} | {lo:.2f} |")
    print("\n| import (fresh interpreter) | median ms | min ms |\n|---|---|---|")
    for name, med, lo in import_times(n):
        print(f"| `{name}` | {med:.1f} | {lo:.1f} |")


if __name__ == "__main__":
    main()
