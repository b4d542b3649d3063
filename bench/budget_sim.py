"""The sequential budget verdict simulated (quantrack.accuracy.budget.simulate): at a known true Δ and discordance,
the share of runs declared within / exceeds / undecided inside a pool, and the questions they needed.

    python bench/budget_sim.py [--runs 1000] [--pool 8787] [--budget-pp 1] [--seed 7]

Prints a Markdown table (docs/accuracy.md, "The budget verdict"). Δ = −budget is the boundary: a 'within' there is
an error, and its share must stay at or below α/2 = 2.5%.
"""

from __future__ import annotations

import argparse
import sys
import time

from quantrack.accuracy.budget import simulate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--pool", type=int, default=8787)
    ap.add_argument("--budget-pp", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    if not (a.runs >= 10 and a.pool >= 10 and 0 < a.budget_pp < 50):
        print("budget_sim: need --runs >= 10, --pool >= 10 and 0 < --budget-pp < 50", file=sys.stderr)
        return 2
    b = a.budget_pp / 100
    cells = [(d, disc) for disc in (0.03, 0.05, 0.08, 0.11, 0.15) for d in (0.0, -b, -0.03) if abs(d) <= disc]
    print("| true Δ | discordance | within | exceeds | undecided | median questions (settled runs) | 90th pct |")
    print("|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    for d, disc in cells:
        r = simulate(d, disc, b, runs=a.runs, max_questions=a.pool, seed=a.seed)
        med = f"{r['median_questions']:,.0f}" if r["median_questions"] is not None else "—"
        p90 = f"{r['p90_questions']:,.0f}" if r["p90_questions"] is not None else "—"
        print(f"| {d * 100:+.1f} pts | {disc:.0%} | {r['within']:.1%} | {r['exceeds']:.1%} | {r['undecided']:.1%} "
              f"| {med} | {p90} |")
    print(f"\n{a.runs:,} runs per row, pool {a.pool:,} questions, budget {a.budget_pp:g} pt, seed {a.seed}; "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
