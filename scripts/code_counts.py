#!/usr/bin/env python3
"""The growth counts issue 42 tracks, for a tree of quantrack: lines of the package, `dict[str, Any]` spelled in
it, functions of 80 lines or more, and broad exception handlers (`except Exception`, `except BaseException`, bare
`except:`). Printed for docs/architecture.md.

    python scripts/code_counts.py [DIR]          # DIR: a checkout's quantrack/ (default: this one's)
    python scripts/code_counts.py --rev REV      # the package as committed at REV (git archive into a temp dir)
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def counts(pkg: Path) -> dict[str, int]:
    lines = dict_any = long_funcs = broad = 0
    for f in sorted(pkg.rglob("*.py")):
        text = f.read_text(encoding="utf-8")
        lines += text.count("\n")
        dict_any += text.count("dict[str, Any]")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
                    and node.end_lineno - node.lineno + 1 >= 80):
                long_funcs += 1
            if isinstance(node, ast.ExceptHandler):
                t = node.type
                names = [t] if not isinstance(t, ast.Tuple) else list(t.elts)
                if t is None or any(isinstance(n, ast.Name) and n.id in ("Exception", "BaseException") for n in names):
                    broad += 1
    return {"package lines": lines, "dict[str, Any]": dict_any, "functions >= 80 lines": long_funcs,
            "broad except": broad}


def at_rev(rev: str) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "quantrack"], capture_output=True,
                              check=True).stdout
        tar = Path(tmp) / "q.tar"
        tar.write_bytes(data)
        with tarfile.open(tar) as tf:
            tf.extractall(tmp, filter="data")
        return counts(Path(tmp) / "quantrack")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", type=Path, default=ROOT / "quantrack")
    ap.add_argument("--rev", default=None)
    a = ap.parse_args()
    c = at_rev(a.rev) if a.rev else counts(a.dir)
    for k, v in c.items():
        print(f"{k}: {v:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
