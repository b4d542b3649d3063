#!/usr/bin/env python3
"""Every generated figure and verdict sentence of the docs, from the committed stores.

Blocks in README.md and docs/*.md between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->`` are written by
this script and by nothing else: a compare table (the output of ``quantrack compare`` on a committed store, run as
a command), a table of paired Δ, or sentences from ``quantrack.report.claims`` (a ranking only where the paired
test excludes zero; "within" only where the budget verdict is within). Each block names its command.

    python scripts/docs_figures.py --check    # regenerate; exit 1 naming every block that differs (CI: a test runs it)
    python scripts/docs_figures.py --write    # rewrite the blocks in place
    python scripts/docs_figures.py --show NAME

Stores are unpacked once into a temporary folder; nothing in the repository is written except by ``--write``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quantrack.accuracy.budget import fixed_verdict
from quantrack.accuracy.paired import compare_runs
from quantrack.accuracy.stats import PairedComparison
from quantrack.report.armrun import ArmRun, arm_set, as_arm_runs, paired_test
from quantrack.report.claims import p_text, pair_sentence, signed, verdict_clause
from quantrack.store.tracking import load_runs

H200 = "docs/gpu/h200-qwen2.5-coder-1.5b-store.tar.gz"
BUDGET = "docs/gpu/h200-qwen2.5-coder-1.5b-budget-store.tar.gz"
CPU_QWEN = "docs/cpu-qwen-store.tar.gz"
CAPITALS = "docs/cpu-smollm2-capitals-store.tar.gz"
BUDGET2 = "docs/gpu/h200-qwen2.5-coder-1.5b-budget2-store.tar.gz"  # the second budget lease: store + work files
HUMANEVAL = "h200-qwen2.5-coder-1.5b-humaneval-vllm"
# where each store's sqlite database lies once unpacked into <dir>
DB = {H200: "qt-mlruns/mlflow.db", BUDGET: "qt-mlruns/mlflow.db", CPU_QWEN: "cpu-qwen-store/mlflow.db",
      CAPITALS: "store/mlflow.db", BUDGET2: "qt-mlruns/mlflow.db"}
# the folder the docs' commands unpack each store into
UNPACK = {H200: "h200", BUDGET: "h200-budget", CPU_QWEN: "cpu-qwen", CAPITALS: "cpu-capitals", BUDGET2: "h200-budget2"}
BUDGET_1PT = 0.01


class Stores:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._done: set[str] = set()

    def dir(self, tarball: str) -> Path:
        d = self.root / UNPACK[tarball]
        if tarball not in self._done:
            d.mkdir(parents=True, exist_ok=True)
            with tarfile.open(ROOT / tarball) as tf:
                tf.extractall(d, filter="data")
            self._done.add(tarball)
        return d

    def uri(self, tarball: str) -> str:
        return f"sqlite:///{self.dir(tarball) / DB[tarball]}"

    def arms(self, tarball: str, experiment: str) -> dict[str, ArmRun]:
        runs = as_arm_runs(load_runs(experiment, self.uri(tarball)))
        return arm_set(runs).chosen

    def paired(self, tarball: str, experiment: str, base: str, arm: str) -> PairedComparison:
        a = self.arms(tarball, experiment)
        pt = paired_test(a[base], a[arm])
        if pt.comparison is None:
            raise SystemExit(f"{experiment}: no paired test of {arm} against {base}: {pt.cell}")
        return pt.comparison


def _int(v: float | None) -> str:
    return "unknown" if v is None else f"{round(v):,}"


def unpack_line(tarball: str) -> str:
    return f"$ mkdir -p {UNPACK[tarball]} && tar -xzf {tarball} -C {UNPACK[tarball]}"


def compare_block(stores: Stores, tarball: str, experiment: str, table_only: bool = True) -> str:
    """The command and its output, run as a user runs it (from the folder the store was unpacked beside)."""
    uri_rel = f"sqlite:///{UNPACK[tarball]}/{DB[tarball]}"
    stores.dir(tarball)
    cmd = ["quantrack", "compare", "--experiment", experiment, "--tracking-uri", uri_rel]
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120", NO_COLOR="1")
    out = subprocess.run([sys.executable, "-m", "quantrack.cli", *cmd[1:]], cwd=stores.root, env=env,
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    if table_only:  # the table itself: from its header to the first blank line
        start = next(i for i, ln in enumerate(lines) if ln.startswith("Arm "))
        end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
        lines = lines[start:end]
    return "\n".join(["```", unpack_line(tarball), "$ " + " ".join(cmd), *lines, "```"])


# --- the blocks ---------------------------------------------------------------------------------------------

VLLM = "h200-qwen2.5-coder-1.5b-vllm"
KV_VLLM = "h200-qwen2.5-coder-1.5b-kv-vllm"
BUDGET_EXP = "h200-qwen2.5-coder-1.5b-budget-vllm"
# the two bf16 runs of the budget study (two studies ran side by side, each with its own bf16 baseline)
BUDGET_BASE, BUDGET_AGAIN = "bd4ead6bc6d44853ac935c3db431d08f", "3abbc6a783a448f8a3df0802505c4d25"

KV_LABELS = [  # arm -> how the docs name it (words, not figures)
    ("kv-int8-per-token-head", "INT8, a scale per (token, head)"),
    ("kv-fp8-calibrated", "FP8, scales calibrated with llm-compressor"),
    ("kv-fp8", "FP8, scales 1.0 (the default)"),
    ("kv-fp8-per-token-head", "FP8, a scale per (token, head)"),
    ("kv-fp8-computed", "FP8, scales computed at start-up"),
]


def h200_compare(s: Stores) -> str:
    return compare_block(s, H200, VLLM)


SGLANG, KV_SGLANG = "h200-qwen2.5-coder-1.5b-sglang", "h200-qwen2.5-coder-1.5b-kv-sglang"


def h200_sglang(s: Stores) -> str:
    fp8 = s.paired(H200, SGLANG, "bf16", "fp8")
    cal = s.paired(H200, KV_SGLANG, "kv-fp8", "kv-fp8-calibrated")
    kv = s.arms(H200, KV_SGLANG)
    kl = {a: kv[a].kl_mean for a in ("kv-fp8", "kv-fp8-calibrated")}
    same = "identical" if kl["kv-fp8"] is not None and kl["kv-fp8"] == kl["kv-fp8-calibrated"] else "not identical"
    return "\n".join([
        compare_block(s, H200, SGLANG), "",
        f"- {pair_sentence('fp8 (FP8 weights)', 'bf16', fp8, fixed_verdict(fp8, BUDGET_1PT))}",
        (f"- KV cache, experiment `{KV_SGLANG}`: "
         f"{pair_sentence('FP8 with a calibrated checkpoint', 'FP8 with scales 1.0', cal)} Their decode-side KL is "
         f"{same} ({_num(kl['kv-fp8-calibrated'])} and {_num(kl['kv-fp8'])})."),
    ])


def _num(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.4f}"


def cpu_qwen_compare(s: Stores) -> str:
    return compare_block(s, CPU_QWEN, "cpu-qwen2.5-coder-0.5b", table_only=False)


def _records(s: Stores, run_id: str) -> str:
    return str(s.dir(BUDGET) / "qt-mlruns" / "artifacts" / run_id / "artifacts" / "eval" / "records.jsonl")


def h200_verdicts(s: Stores) -> str:
    fp8 = s.paired(H200, VLLM, "bf16", "fp8")
    kv = s.paired(H200, VLLM, "bf16", "fp8-kv")
    arms = s.arms(H200, VLLM)
    tok = {a: arms[a].kv_tokens_reported for a in ("bf16", "fp8-kv")}
    rep = compare_runs(_records(s, BUDGET_BASE), _records(s, BUDGET_AGAIN), budget=BUDGET_1PT, sequential=True)
    again_pc = PairedComparison(**{k: v for k, v in rep["comparison"].items() if k in PairedComparison.__annotations__})
    from quantrack.accuracy.budget import BudgetVerdict

    again_v = BudgetVerdict(**rep["budget"])
    ratio = f"{tok['fp8-kv'] / tok['bf16']:.2f}×" if tok["bf16"] and tok["fp8-kv"] else "unknown"
    return "\n".join([
        f"- **FP8 weights** (`fp8`): {pair_sentence('fp8', 'bf16', fp8, fixed_verdict(fp8, BUDGET_1PT))}",
        (f"- **FP8 weights + FP8 KV cache, the engine's default scales** (`fp8-kv`): "
        f"{pair_sentence('fp8-kv', 'bf16', kv)} KV tokens {_int(tok['fp8-kv'])} against {_int(tok['bf16'])} "
        f"({ratio})."),
        (f"- **bf16 against a second bf16 server** of the same configuration (the budget study's store, "
        f"`{BUDGET}`): {pair_sentence('the second bf16', 'the first', again_pc, again_v)}"),
        "",
        (f"(`quantrack compare --budget 1pp` on `{H200}` for the first two, fixed n; `quantrack eval compare "
        f"--budget 1pp --sequential` on the two bf16 runs' `eval/records.jsonl` ({BUDGET_BASE[:8]}…, "
        f"{BUDGET_AGAIN[:8]}…) for the third.)"),
    ])


def h200_kv_table(s: Stores) -> str:
    arms = s.arms(H200, KV_VLLM)
    base = arms["bf16"]
    n = None
    rows = []
    for name, label in KV_LABELS:
        pc = s.paired(H200, KV_VLLM, "bf16", name)
        n = pc.n if n is None else n
        if pc.n != n:
            raise SystemExit(f"{name}: {pc.n} paired questions, others {n}: one n per table")
        tok, btok = arms[name].kv_tokens_reported, base.kv_tokens_reported
        ratio = f" ({tok / btok:.2f}×)" if tok and btok else ""
        kl = arms[name].kl_mean
        rows.append(f"| {label} | {_int(tok)}{ratio} | {signed(pc.delta * 100)} pts [{signed(pc.delta_ci_low * 100)}, "
                    f"{signed(pc.delta_ci_high * 100)}] (p = {p_text(pc.mcnemar_p)}) | "
                    f"{'unknown' if kl is None else f'{kl:.4f}'} |")
    head = [(f"| KV cache (vLLM 0.25.0, experiment `{KV_VLLM}`) | KV tokens | GSM8K Δ vs bf16, paired 95% interval "
            f"(n = {n:,}) | decode-side KL |"), "|---|---|---|---|"]
    return "\n".join(head + rows)


def h200_kv_sentences(s: Stores) -> str:
    int8 = s.paired(H200, KV_VLLM, "bf16", "kv-int8-per-token-head")
    lines = [f"- {pair_sentence('INT8 per (token, head)', 'bf16', int8, fixed_verdict(int8, BUDGET_1PT))}"]
    for a, b, la, lb in [("kv-fp8-per-token-head", "kv-fp8-computed", "FP8 per (token, head)",
                          "FP8 with scales computed at start-up"),
                         ("kv-fp8-per-token-head", "kv-fp8", "FP8 per (token, head)", "FP8 with scales 1.0"),
                         ("kv-fp8-computed", "kv-fp8", "FP8 with scales computed at start-up", "FP8 with scales 1.0"),
                         ("kv-fp8-calibrated", "kv-fp8", "FP8 with calibrated scales", "FP8 with scales 1.0")]:
        lines.append(f"- {pair_sentence(la, lb, s.paired(H200, KV_VLLM, b, a))}")
    lines += ["", (f"(paired tests between the arms' per-question outcomes in `{H200}`, experiment `{KV_VLLM}`: the "
              "same test `quantrack eval compare` runs on their records)")]
    return "\n".join(lines)


def cpu_qwen_q4(s: Stores) -> str:
    pc = s.paired(CPU_QWEN, "cpu-qwen2.5-coder-0.5b", "F16", "Q4_0")
    q4 = s.arms(CPU_QWEN, "cpu-qwen2.5-coder-0.5b")["Q4_0"]
    fid = ("" if q4.kl_top1_agree is None or q4.kl_mean is None else
           f" Its top-1 agreement with F16 is {q4.kl_top1_agree * 100:.1f}% and its mean KL {q4.kl_mean:.4f} nats.")
    return (f"{pair_sentence('Q4_0', 'F16', pc)} Q4_0 answered {pc.arm_correct} of {pc.n}, F16 {pc.base_correct}; "
            f"{pc.base_only} of the {pc.base_only + pc.arm_only} discordant questions were F16-only.{fid}")


def _hms(seconds: float) -> str:
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return (f"{h} h " if h else "") + f"{m} min {sec} s"


def cpu_qwen_walls(s: Stores) -> str:
    """Each finished arm's wall time, its run's start to its end in the store (not the sum of its step timers)."""
    runs = {r.arm: r for r in load_runs("cpu-qwen2.5-coder-0.5b", s.uri(CPU_QWEN))}
    parts = [f"{a} {_hms((r.end_time - r.start_time) / 1000)}" for a, r in sorted(runs.items(), key=lambda x:
             x[1].start_time) if r.status == "FINISHED" and r.end_time and r.start_time]
    return (f"Per finished arm, its run's start to its end in the store: {'; '.join(parts)} (each run's start "
            "and end time in MLflow; the arms' step timers sum to less: logging and the gaps between steps are not in "
            "a step).")


def capitals(s: Stores) -> str:
    exp = "cpu-smollm2-capitals"
    lines = [compare_block(s, CAPITALS, exp, table_only=False), ""]
    for arm in ("Q8_0", "Q4_0"):
        lines.append(f"- {pair_sentence(arm, 'F16', s.paired(CAPITALS, exp, 'F16', arm))}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Block:
    name: str
    doc: str
    make: Callable[[Stores], str]


def _pool_pair(s: Stores, base: str, arm: str) -> tuple[PairedComparison, object]:
    """Two work files of the second budget lease, paired, with the sequential 1-point verdict (in the arm's order)."""
    from quantrack.accuracy.budget import BudgetVerdict

    d = s.dir(BUDGET2) / "work"
    rep = compare_runs(str(d / base), str(d / arm), budget=BUDGET_1PT, sequential=True)
    pc = PairedComparison(**{k: v for k, v in rep["comparison"].items() if k in PairedComparison.__annotations__})
    return pc, BudgetVerdict(**rep["budget"])


def h200_budget2(s: Stores) -> str:
    """FP8 weights and INT8 KV on the 8,787-question pool (the second budget lease), from its work files."""
    fp8, fp8_v = _pool_pair(s, "wd-ba/bf16-gsm8k.jsonl", "wd-ba/fp8-gsm8k.jsonl")
    fp8b, fp8b_v = _pool_pair(s, "wd-bb/bf16-gsm8k.jsonl", "wd-ba/fp8-gsm8k.jsonl")
    kv, kv_v = _pool_pair(s, "wd-bb/bf16-gsm8k.jsonl", "wd-bb/kv-int8-per-token-head-gsm8k.jsonl")
    floor, floor_v = _pool_pair(s, "wd-ba/bf16-gsm8k.jsonl", "wd-bb/bf16-gsm8k.jsonl")
    return "\n".join([
        f"- **FP8 weights** against the bf16 of its own run: {pair_sentence('fp8', 'bf16', fp8, fp8_v)}",  # type: ignore[arg-type]
        f"- **FP8 weights** against the other run's bf16: {pair_sentence('fp8', 'bf16', fp8b, fp8b_v)}",  # type: ignore[arg-type]
        (f"- **INT8 KV, a scale per (token, head)**, stopped by its sequential test: "
         f"{verdict_clause(kv_v)}. The fixed-n figures on the questions it answered "  # type: ignore[arg-type]
         f"(Δ {signed(kv.delta * 100)} points, 95% interval [{signed(kv.delta_ci_low * 100)}, "
         f"{signed(kv.delta_ci_high * 100)}], n = {kv.n:,}) are taken at a stopping point the data chose, so they "
         "are not a valid test of a difference; only the confidence sequence is."),
        f"- **The floor**, the two bf16 servers: {pair_sentence('the second bf16', 'the first', floor, floor_v)}",  # type: ignore[arg-type]
        "",
        (f"(`quantrack eval compare BASE ARM --budget 1pp --sequential` on the work files in `{BUDGET2}`: "
         "`work/wd-ba/bf16-gsm8k.jsonl`, `work/wd-ba/fp8-gsm8k.jsonl`, `work/wd-bb/bf16-gsm8k.jsonl`, "
         "`work/wd-bb/kv-int8-per-token-head-gsm8k.jsonl`.)"),
    ])


def h200_humaneval(s: Stores) -> str:
    """HumanEval pass@1 per arm on the H200 (sandboxed execution), paired with bf16, from the store."""
    arms = s.arms(BUDGET2, HUMANEVAL)
    rows = ["| Arm (vLLM 0.25.0, experiment `" + HUMANEVAL + "`) | HumanEval pass@1 (n = 164) | Δ vs bf16, paired "
            "95% interval | exact McNemar p | 1-point budget (fixed n) |", "|---|---|---|---|---|"]
    for name in ("bf16", "fp8", "kv-fp8"):
        r = arms[name]
        acc = r.accuracy
        correct = round((acc.accuracy or 0) * (acc.n or 0))
        cell = f"{(acc.accuracy or 0) * 100:.1f}% ({correct}/{int(acc.n or 0)})"
        if name == "bf16":
            rows.append(f"| {name} | {cell} | — (baseline) | — | — |")
            continue
        pc = s.paired(BUDGET2, HUMANEVAL, "bf16", name)
        v = fixed_verdict(pc, BUDGET_1PT)
        rows.append(f"| {name} | {cell} | {signed(pc.delta * 100)} [{signed(pc.delta_ci_low * 100)}, "
                    f"{signed(pc.delta_ci_high * 100)}] | {p_text(pc.mcnemar_p)} | {v.verdict} |")
    return "\n".join(rows)


BLOCKS = [
    Block("h200-budget2", "README.md", h200_budget2),
    Block("h200-budget2-doc", "docs/gpu/h200-qwen2.5-coder-1.5b-budget.md", h200_budget2),
    Block("h200-humaneval", "README.md", h200_humaneval),
    Block("h200-humaneval-doc", "docs/gpu/h200-qwen2.5-coder-1.5b-humaneval.md", h200_humaneval),
    Block("h200-vllm-compare", "README.md", h200_compare),
    Block("h200-verdicts", "README.md", h200_verdicts),
    Block("h200-kv-table", "README.md", h200_kv_table),
    Block("h200-kv-sentences", "README.md", h200_kv_sentences),
    Block("kv-sentences", "docs/kv-cache.md", h200_kv_sentences),
    Block("h200-sglang", "README.md", h200_sglang),
    Block("cpu-capitals", "README.md", capitals),
    Block("cpu-qwen-compare", "README.md", cpu_qwen_compare),
    Block("cpu-qwen-q4", "README.md", cpu_qwen_q4),
    Block("cpu-qwen-walls", "README.md", cpu_qwen_walls),
    Block("cpu-qwen-walls-doc", "docs/cpu-study-qwen.md", cpu_qwen_walls),
]


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:{re.escape(name)} [^\n]*-->\n)(.*?)(\n<!-- /figures:{re.escape(name)} -->)",
                      re.DOTALL)


def opening(name: str) -> str:
    return f"<!-- figures:{name} (generated: python scripts/docs_figures.py --write; do not edit by hand) -->"


def run(mode: str, only: str | None = None, docs_root: Path = ROOT) -> int:
    bad: list[str] = []
    with tempfile.TemporaryDirectory(prefix="qt-docs-figures-") as tmp:
        stores = Stores(Path(tmp))
        texts: dict[str, str] = {}
        for b in BLOCKS:
            if only and b.name != only:
                continue
            body = b.make(stores)
            if mode == "show":
                print(body)
                continue
            path = docs_root / b.doc
            if b.doc not in texts and not path.is_file():
                bad.append(f"{b.doc}: no such file under {docs_root} (block {b.name!r})")
                continue
            text = texts.get(b.doc) or path.read_text(encoding="utf-8")
            m = _pattern(b.name).search(text)
            if m is None:
                bad.append(f"{b.doc}: no block {b.name!r} (markers {opening(b.name)} … <!-- /figures:{b.name} -->)")
                continue
            if m.group(2) != body:
                if mode == "check":
                    diff = "\n".join(difflib.unified_diff(m.group(2).splitlines(), body.splitlines(),
                                                          "committed", "from the store", lineterm="", n=0))
                    bad.append(f"{b.doc}: block {b.name!r} differs from the store:\n{diff}")
                text = text[:m.start()] + opening(b.name) + "\n" + body + m.group(3) + text[m.end():]
            texts[b.doc] = text
        if mode == "write":
            for doc, text in texts.items():
                (docs_root / doc).write_text(text, encoding="utf-8")
    for line in bad:
        print(line, file=sys.stderr)
    if bad and mode == "check":
        print(f"{len(bad)} generated block(s) differ: run python scripts/docs_figures.py --write (never edit them by "
              "hand)", file=sys.stderr)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    g.add_argument("--show", metavar="NAME")
    ap.add_argument("--root", type=Path, default=ROOT, help="the folder holding README.md and docs/ (default: this "
                    "checkout; the stores are always this checkout's)")
    a = ap.parse_args()
    if a.show:
        if a.show not in {b.name for b in BLOCKS}:
            print(f"no block {a.show!r}; blocks: {', '.join(b.name for b in BLOCKS)}", file=sys.stderr)
            return 2
        return run("show", a.show)
    return run("check" if a.check else "write", docs_root=a.root)


if __name__ == "__main__":
    sys.exit(main())
