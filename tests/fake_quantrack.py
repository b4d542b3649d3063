"""``python tests/fake_quantrack.py ARGS``: the quantrack CLI in its own process with the fake engine
(tests/fake_engine.py) registered, for tests that need a real `quantrack run` process to kill without an inference
engine (``--interval-ms MS`` first sets the fake engine's time between tokens). Test code, never shipped."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantrack import engines
from quantrack.cli import main
from tests.fake_engine import FakeAdapter

if __name__ == "__main__":
    args = sys.argv[1:]
    interval = 2.0
    if args[:1] == ["--interval-ms"]:
        interval, args = float(args[1]), args[2:]
    engines.register(FakeAdapter(interval_ms=interval))
    raise SystemExit(main(args))
