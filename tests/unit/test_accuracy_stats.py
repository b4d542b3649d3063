"""Binomial summaries and the paired comparison (Newcombe interval, exact McNemar)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from quantrack.accuracy import stats
from quantrack.accuracy.gsm8k import result_from_records, small_sample_warning
from quantrack.accuracy.records import QuestionRecord, load_records
from quantrack.errors import BadInput

DATA = Path(__file__).resolve().parents[1] / "data" / "eval"


def test_wilson_interval_from_scipy() -> None:
    p = stats.proportion(10, 20)
    assert p.p == 0.5 and p.se == pytest.approx(math.sqrt(0.25 / 20))
    # Wilson score interval, closed form: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z, n = 1.959963984540054, 20
    centre, half = (0.5 + z * z / (2 * n)), z * math.sqrt(0.25 / n + z * z / (4 * n * n))
    assert p.ci_low == pytest.approx((centre - half) / (1 + z * z / n), abs=1e-9)
    assert p.ci_high == pytest.approx((centre + half) / (1 + z * z / n), abs=1e-9)


def test_zero_of_n_has_nonzero_upper_bound() -> None:
    p = stats.proportion(0, 8)
    assert p.p == 0.0 and p.se == 0.0 and p.ci_low == pytest.approx(0.0, abs=1e-12)
    assert p.ci_high == pytest.approx(0.3244, abs=1e-4)


def test_empty_and_bad_counts() -> None:
    assert stats.proportion(0, 0).p is None
    with pytest.raises(BadInput, match=r"^invalid counts: 5 correct out of 3$"):
        stats.proportion(5, 3)


def test_detectable_difference_formula() -> None:
    assert stats.detectable_multiplier() == pytest.approx(1.959964 + 0.841621, abs=1e-5)
    # a 200-question run near 80%: SE 2.8 pts, so only ~11 pt differences are detectable
    se = math.sqrt(0.8 * 0.2 / 200)
    assert stats.min_detectable_difference(se) == pytest.approx(2.8016 * math.sqrt(2) * se, rel=1e-4)


def test_newcombe_matches_published_example() -> None:
    # Fagerland, Lydersen & Laake (2017), ch. 8, Cavo et al. (2012) table [[59, 6], [16, 80]]:
    # Newcombe square-and-add estimate -0.0621 (95% CI -0.1186 to -0.0046), as asserted in the
    # contingencytables R package tests. Rows = group 1 (our arm), columns = group 2 (our base).
    cmp = stats.compare_counts(a=59, b=16, c=6, d=80)
    assert cmp.delta == pytest.approx(-0.0621, abs=5e-5)
    assert cmp.delta_ci_low == pytest.approx(-0.1186, abs=5e-5)
    assert cmp.delta_ci_high == pytest.approx(-0.0046, abs=5e-5)


def test_newcombe_close_to_wald_at_gsm8k_scale() -> None:
    a, b, c, d = 900, 40, 60, 319  # 1319 paired questions
    cmp = stats.compare_counts(a, b, c, d)
    n = a + b + c + d
    se = math.sqrt((b + c) - (c - b) ** 2 / n) / n
    assert cmp.delta_ci_low == pytest.approx(cmp.delta - 1.96 * se, abs=0.002)
    assert cmp.delta_ci_high == pytest.approx(cmp.delta + 1.96 * se, abs=0.002)


def test_mcnemar_exact_on_discordant_pairs() -> None:
    cmp = stats.compare_counts(a=100, b=2, c=10, d=50)
    # two-sided exact binomial on 2 of 12 at 0.5: 2 * P(X <= 2) = 2 * (1 + 12 + 66) / 4096
    assert cmp.mcnemar_p == pytest.approx(2 * 79 / 4096)
    assert not cmp.within_noise and "better" in cmp.verdict()


def test_within_noise_verdict() -> None:
    cmp = stats.compare_counts(a=600, b=20, c=22, d=677)
    assert cmp.within_noise
    assert cmp.verdict().startswith("Delta +0.15 pts is within noise: the 95% CI [")


def test_interval_excluding_zero_but_test_not_rejecting_is_noise() -> None:
    cmp = stats.compare_counts(a=600, b=40, c=60, d=619)
    assert cmp.delta_ci_low > 0 and cmp.mcnemar_p > 0.05
    assert cmp.within_noise and "does not reject" in cmp.verdict()


def test_paired_counts_skip_errors_and_unshared() -> None:
    def rec(i: int, correct: bool | None, error: str | None = None) -> QuestionRecord:
        return QuestionRecord(id=i, prompt_sha256="h", response="r", extracted=1, gold=1, correct=correct,
                              error=error)

    base = {0: rec(0, True), 1: rec(1, False), 2: rec(2, True), 3: rec(3, None, "HTTP 500")}
    arm = {0: rec(0, True), 1: rec(1, True), 2: rec(2, False), 3: rec(3, True), 4: rec(4, True)}
    assert stats.paired_counts(base, arm) == (1, 1, 1, 0)


def test_no_pairs_is_an_error() -> None:
    with pytest.raises(BadInput, match=r"^no question was answered by both runs: nothing to pair$"):
        stats.compare_counts(0, 0, 0, 0)


def test_real_records_summary_and_small_sample_warning() -> None:
    recs = load_records(DATA / "smol-q41-max64.jsonl")
    res = result_from_records(recs, num_questions=8, style="vllm", records_path=None)
    assert (res.n, res.correct, res.invalid, res.errors) == (8, 0, 1, 0)
    assert res.accuracy == 0.0 and res.ci_high == pytest.approx(0.3244, abs=1e-4)
    warning = small_sample_warning(res)
    assert warning is not None
    assert warning.startswith("warning: 8 answered questions (< 1319): SE 17.7 pts (worst case p=0.5); ")
    assert "70.0 pts" in warning and "2.80 x sqrt(2) x SE" in warning


def test_errors_count_separately_not_as_wrong() -> None:
    recs = {i: QuestionRecord(id=i, prompt_sha256=None, response="x", extracted=i, gold=i, correct=True)
            for i in range(3)}
    recs[3] = QuestionRecord(id=3, prompt_sha256=None, response=None, extracted=None, gold=None, correct=None,
                             error="ConnectError: refused")
    res = result_from_records(recs, num_questions=4, style="vllm", records_path=None)
    assert (res.n, res.correct, res.errors, res.accuracy) == (3, 3, 1, 1.0)
