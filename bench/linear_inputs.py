"""Time redaction and the SLO / accuracy-budget parsers on hostile inputs of 10^5 to 10^6 characters.

    python bench/linear_inputs.py [--sizes 100000,200000,400000,1000000] [--runs 3]

Issue #30: the redaction pattern was O(n^2) (a 100k-character study name hung `run` for minutes) and the SLO /
budget patterns took 50-90 s on long digit strings. For each input shape (a long word, "a.a.a…", "A_A_…", a long
digit run, repeated "token='", a URL-ish run, and the old worst cases) it prints the best wall time of
``redact_text`` at each size and the time per million characters; linear means that figure stays flat as the
size grows. The SLO and budget *patterns* are timed directly on a long digit string (the parsers refuse any
string over ``MAX_CONSTRAINT_CHARS`` before matching, so through the parser the cost is constant), and the
parsers' refusal is timed too. Results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES: dict[str, str] = {
    "word": "a",
    "dotted": "a.",
    "upper_": "A_",
    "digits": "1",
    "dashed": "a-",
    "token='": "token='",
    "scheme": "a://b:",
    "api_key words": "xapi_key ",
    "prose": "the quick brown fox: 12 ",
}


def best(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="100000,200000,400000,1000000")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from quantrack.constraints import _PP_RE, _SLO_RE, parse_accuracy_drop, parse_slo
    from quantrack.errors import BadInput
    from quantrack.redact import redact_text

    def row(name: str, make: Callable[[int], Callable[[], object]]) -> None:
        cells = []
        for n in sizes:
            t = best(make(n), args.runs)
            cells.append(f"{t * 1000:8.1f} ms ({t / n * 1e6:6.2f} ms/Mchar)")
        print(f"{name:<28}" + " | ".join(cells))

    print(f"{'input':<28}" + " | ".join(f"{n:>26,}" for n in sizes))
    for shape, unit in SHAPES.items():
        row(f"redact_text {shape}", lambda n, u=unit: (lambda s=(u * n)[:n]: redact_text(s)))
    row("_SLO_RE tpot_p99<=1…1", lambda n: (lambda s="tpot_p99<=" + "1" * n: _SLO_RE.match(s)))
    row("_SLO_RE tpot_p99<=1…1ms@x", lambda n: (lambda s="tpot_p99<=" + "1" * n + "ms@x": _SLO_RE.match(s)))
    row("_PP_RE 1…1x", lambda n: (lambda s="1" * n + "x": _PP_RE.match(s)))

    def refused(fn: Callable[[str], object], text: str) -> Callable[[], object]:
        def call() -> None:
            try:
                fn(text)
            except BadInput:
                return
            raise AssertionError("accepted")
        return call

    row("parse_slo (refused)", lambda n: refused(parse_slo, "tpot_p99<=" + "1" * n))
    row("parse_accuracy_drop (refused)", lambda n: refused(parse_accuracy_drop, "1" * n + "x"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
