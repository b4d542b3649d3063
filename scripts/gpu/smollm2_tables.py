#!/usr/bin/env python3
"""The accuracy and fidelity tables of docs/gpu/h200-smollm2.md, from the returned MLflow store (nothing typed in).

  smollm2_tables.py STORE_DIR [EXPERIMENT...]     (STORE_DIR holds mlflow.db and artifacts/, as the archive unpacks)

Per arm: GSM8K accuracy with its 95% Wilson interval; Δ vs the baseline arm with the paired 95% Newcombe interval and
the exact McNemar p over the 1,319 questions both answered (quantrack.accuracy.stats.compare_runs, the same code as
`quantrack eval compare`); KL(bf16 || arm) and top-1 agreement with their bootstrap intervals over texts (the arm's
kl/result.json). "distinguishable" = the 95% interval excludes 0 (accuracy) / the KL interval lies above the floor
given with --floor.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path


def arms(store: Path, experiment: str) -> list[tuple[str, str, str]]:
    con = sqlite3.connect(f"file:{store / 'mlflow.db'}?mode=ro", uri=True)
    rows = con.execute(
        "select r.name, r.run_uuid, r.status from runs r join experiments e on r.experiment_id = e.experiment_id "
        "where e.name = ? and r.name not like 'study:%' order by r.start_time", (experiment,)).fetchall()
    return [(str(n), str(u), str(s)) for n, u, s in rows]


def main(argv: list[str]) -> None:
    from quantrack.accuracy.stats import compare_runs, proportion

    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("experiments", nargs="*", default=["h200-smollm2-vllm", "h200-smollm2-sglang"])
    ap.add_argument("--baseline", default="bf16")
    ap.add_argument("--floor", type=float, default=None, help="cross-engine KL floor (upper CI end), nats")
    args = ap.parse_args(argv)
    store = Path(args.store)
    print("| engine | arm | GSM8K [95% Wilson] | Δ vs bf16, pts [95% paired] | discordant (base-only / arm-only) "
          "| McNemar p (exact) | top-1 agree [95% CI] | KL mean, nats [95% CI] | KL lower bound | distinguishable |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for exp in args.experiments:
        runs = arms(store, exp)
        base = next((u for n, u, s in runs if n == args.baseline), None)
        for name, uid, status in runs:
            art = store / "artifacts" / uid / "artifacts"
            rec = art / "eval" / "records.jsonl"
            engine = exp.rsplit("-", 1)[-1]
            if status != "FINISHED" or not rec.is_file():
                print(f"| {engine} | {name} | {status}: not measured | | | | | | | |")
                continue
            lines = [json.loads(x) for x in rec.read_text().splitlines() if x.strip()]
            k = sum(1 for r in lines if r.get("correct"))
            p = proportion(k, len(lines))
            acc = f"{p.p * 100:.2f}% [{p.ci_low * 100:.2f}, {p.ci_high * 100:.2f}] ({k}/{len(lines)})"
            delta = disc = mcn = "—"
            dist = []
            if base and uid != base:
                cmp = compare_runs(str(store / "artifacts" / base / "artifacts" / "eval" / "records.jsonl"), str(rec))
                c = cmp["comparison"]
                delta = (f"{c['delta'] * 100:+.2f} [{c['delta_ci_low'] * 100:+.2f}, "
                         f"{c['delta_ci_high'] * 100:+.2f}]")
                disc = f"{c['base_only']} / {c['arm_only']}"
                mcn = f"{c['mcnemar_p']:.3g}"
                # quantrack's verdict (stats.PairedComparison.within_noise), not a rule of this script
                dist.append("accuracy: no" if c["within_noise"] else "accuracy: yes")
            top1 = kl = low = "—"
            klf = art / "kl" / "result.json"
            if klf.is_file():
                r = json.loads(klf.read_text())
                ci = r.get("ci") or {}
                t, m = ci.get("top1_agree") or [None, None], ci.get("kl_mean") or [None, None]
                top1 = f"{r['top1_agree'] * 100:.1f}% [{t[0] * 100:.1f}, {t[1] * 100:.1f}]"
                kl = f"{r['kl_mean']:.4f} [{m[0]:.4f}, {m[1]:.4f}]"
                low = f"{r['kl_lower_mean']:.4f}"
                if args.floor is not None:
                    dist.append(f"KL > floor: {'yes' if m[0] > args.floor else 'no'}")
            print(f"| {engine} | {name} | {acc} | {delta} | {disc} | {mcn} | {top1} | {kl} | {low} | "
                  f"{'; '.join(dist) or '—'} |")


if __name__ == "__main__":
    main(sys.argv[1:])
