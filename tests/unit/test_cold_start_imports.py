"""`quantrack --help` and `preflight --gpu H100 --arm fp8` must not import heavy packages."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("mlflow", "pandas", "pynvml", "torch", "scipy", "matplotlib")

PROBE = """
import json, sys
from quantrack.cli import main
try:
    code = main({args!r})
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})
print(json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


@pytest.mark.parametrize("args, want_code", [
    (["--help"], 0),
    (["preflight", "--gpu", "H100", "--arm", "fp8"], 0),
])
def test_no_heavy_imports(args, want_code):
    proc = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY)],
                          check=False, capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] == want_code, proc.stderr
    assert report["heavy"] == []
