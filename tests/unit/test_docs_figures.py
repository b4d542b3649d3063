"""Issue #39: every generated figure and verdict sentence of the docs comes from the committed stores.

``scripts/docs_figures.py --check`` regenerates the blocks between ``<!-- figures:NAME -->`` markers and fails on any
difference; it passes on this checkout, and fails (naming the block) on a copy of the docs with one digit changed.
The sentence writer (``quantrack.report.claims``) writes a ranking only where the paired test excludes zero and
never a stronger word than the budget verdict allows.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantrack.accuracy.budget import fixed_verdict
from quantrack.accuracy.stats import compare_counts
from quantrack.report.claims import pair_sentence

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "docs_figures.py"


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--check", "--root", str(root)], check=False,
                          capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # unpacks three stores and runs `quantrack compare` twice: ~10 s
def test_docs_figures_match_the_stores_and_a_changed_digit_fails(tmp_path: Path) -> None:
    ok = _check(ROOT)
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for doc in (ROOT / "docs").glob("*.md"):
        shutil.copy(doc, tmp_path / "docs" / doc.name)
    text = (tmp_path / "README.md").read_text()
    start = text.index("<!-- figures:h200-kv-table")
    cell = text.index("+0.7 pts", start)
    (tmp_path / "README.md").write_text(text[:cell] + "+0.8 pts" + text[cell + len("+0.7 pts"):])
    bad = _check(tmp_path)
    assert bad.returncode == 1
    assert "README.md: block 'h200-kv-table' differs from the store" in bad.stderr
    assert "-| INT8, a scale per (token, head) | 290,512 (1.94×) | +0.8 pts" in bad.stderr
    assert "kv-sentences" not in bad.stderr  # only the edited block is named


def test_a_ranking_only_where_the_paired_test_excludes_zero() -> None:
    # 60 paired questions, 8 discordant (7 base-only): the interval excludes 0, the exact test does not reject
    close = compare_counts(3, 7, 1, 49)
    s = pair_sentence("Q4_0", "F16", close)
    assert "not distinguishable from F16 at n = 60" in s and "worse" not in s
    assert "no difference is established" in s and "a loss of up to" in s
    far = compare_counts(100, 400, 34, 785)
    s = pair_sentence("fp8-kv", "bf16", far)
    assert s.startswith("fp8-kv is worse than bf16 at n = 1,319")


def test_within_only_from_a_within_verdict() -> None:
    undecided = compare_counts(480, 77, 68, 694)  # n = 1,319, Δ −0.7 pts: a 1-point budget undecided
    s = pair_sentence("fp8", "bf16", undecided, fixed_verdict(undecided, 0.01))
    assert "1-point budget is undecided" in s and "within" not in s
    for word in ("free", "equal", "no loss", "no measurable"):
        assert word not in s
    tight = compare_counts(4000, 60, 60, 4666)  # n = 8,786, Δ 0: within 1 point
    s = pair_sentence("bf16-again", "bf16", tight, fixed_verdict(tight, 0.01))
    assert "within a 1-point budget" in s and "settled at 8,786 of 8,786" in s


def test_the_capitals_example_is_a_valid_task_file_study() -> None:
    """examples/cpu-smollm2-capitals.toml (the README's task-file study) reads, with its task file, as run would."""
    from quantrack.study import load_study

    study = load_study(ROOT / "examples" / "cpu-smollm2-capitals.toml")
    assert study.eval.task is not None and study.eval.task.endswith("examples/tasks/capitals.jsonl")
    assert study.eval.num_questions == 40 and study.eval.scorer is not None and study.eval.scorer.startswith("regex:")
