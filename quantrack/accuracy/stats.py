"""Statistics for accuracy runs: binomial summaries and the paired comparison of two arms.

Everything here is derived from counts that were measured or imported; nothing is assumed.

* One run: standard error ``sqrt(p(1-p)/n)`` and the 95% Wilson score interval in closed form
  (Wilson 1927; the same figures as ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``,
  checked in the tests).
* Smallest detectable difference (a planning figure): ``(z_{0.975} + z_{0.80}) * SE_diff`` =
  2.80 x SE_diff, with ``SE_diff = sqrt(2) * SE`` for two runs of the same size and accuracy
  treated as independent (two-sided alpha 0.05, power 0.80). A paired test on the same questions
  usually does better, because the arms agree on most questions.
* Two arms on the same questions: difference Delta = p_arm - p_base with a 95% interval by
  Newcombe's method 10 (hybrid Wilson score interval for paired proportions, no continuity
  correction; Newcombe 1998, Statistics in Medicine 17:2635-2650; checked against the worked
  example in Fagerland, Lydersen & Laake 2017, ch. 8), and an exact McNemar test: the two-sided
  exact binomial test of b successes in b + c trials at 0.5, summed with ``math.comb`` (the same
  p-value as ``scipy.stats.binomtest(b, b + c, 0.5)``, checked in the tests).

The paired comparison, the interval and the planning multiplier need no scipy (``quantrack compare`` and
``quantrack report`` must start fast).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from quantrack.accuracy.records import QuestionRecord
from quantrack.errors import BadInput

ALPHA = 0.05
POWER = 0.80
Z_975 = 1.959963984540054  # standard normal 0.975 quantile (scipy.stats.norm.ppf(0.975); checked in the tests)


@dataclass(frozen=True)
class Proportion:
    """k successes out of n; ``p``/``se``/interval are ``None`` when n == 0."""

    k: int
    n: int
    p: float | None
    se: float | None
    ci_low: float | None
    ci_high: float | None


def proportion(k: int, n: int) -> Proportion:
    if n < 0 or k < 0 or k > n:
        raise BadInput(f"invalid counts: {k} correct out of {n}")
    if n == 0:
        return Proportion(k, n, None, None, None, None)
    p = k / n
    low, high = wilson_interval(k, n)
    return Proportion(k, n, p, math.sqrt(p * (1 - p) / n), low, high)


def wilson_interval(k: int, n: int, z: float = Z_975) -> tuple[float, float]:
    """95% Wilson score interval for k of n (no continuity correction):
    (p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    p = k / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)


def exact_binomial_two_sided_half(k: int, n: int) -> float:
    """Two-sided exact binomial p-value of k successes in n trials at probability 1/2.

    The distribution is symmetric, so the outcomes at most as likely as k are the two tails beyond
    min(k, n-k): p = min(1, 2 * sum_{i <= min(k, n-k)} C(n, i) / 2^n). Summed in exact integers."""
    if n == 0:
        return 1.0
    if not 0 <= k <= n:
        raise BadInput(f"invalid counts: {k} of {n}")
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, (2 * tail) / (1 << n))


def detectable_multiplier(alpha: float = ALPHA, power: float = POWER) -> float:
    """z_{1-alpha/2} + z_{power}: 1.960 + 0.842 = 2.80 at the defaults (the standard normal quantiles from the
    stdlib's ``statistics.NormalDist``: the same figures as ``scipy.stats.norm.ppf``, checked in the tests, without
    importing scipy on the report path)."""
    from statistics import NormalDist

    nd = NormalDist()
    return nd.inv_cdf(1 - alpha / 2) + nd.inv_cdf(power)


def min_detectable_difference(se: float) -> float:
    """Smallest difference two independent runs of this size detect at 80% power, alpha 0.05:
    2.80 x sqrt(2) x SE (see the module docstring)."""
    return detectable_multiplier() * math.sqrt(2.0) * se


def planning_se(p: float | None, n: int) -> float:
    """SE used for the small-sample warning: the observed p, or the worst case 0.5 when p is 0/1/None
    (a 0% or 100% run has SE 0 by the formula, which would promise a precision it does not have)."""
    q = 0.5 if p is None or p in (0.0, 1.0) else p
    return math.sqrt(q * (1 - q) / n)


@dataclass(frozen=True)
class PairedComparison:
    """Base vs arm on the questions both answered."""

    n: int  # paired questions
    base_correct: int
    arm_correct: int
    both_correct: int
    base_only: int  # b: base right, arm wrong
    arm_only: int  # c: base wrong, arm right
    both_wrong: int
    base_accuracy: float
    arm_accuracy: float
    delta: float  # arm - base
    delta_ci_low: float
    delta_ci_high: float
    mcnemar_p: float
    method: str = "Newcombe (1998) method 10 interval; exact McNemar (exact binomial on b of b+c at 1/2)"

    @property
    def within_noise(self) -> bool:
        """True unless both the interval excludes 0 and the exact McNemar test rejects at alpha."""
        return (self.delta_ci_low <= 0.0 <= self.delta_ci_high) or self.mcnemar_p >= ALPHA

    def verdict(self) -> str:
        pts = f"{self.delta * 100:+.2f} pts"
        ci = f"95% CI [{self.delta_ci_low * 100:+.2f}, {self.delta_ci_high * 100:+.2f}] pts"
        test = (f"McNemar exact p = {self.mcnemar_p:.3g} on {self.base_only + self.arm_only} discordant "
                f"of {self.n} paired questions")
        if self.delta_ci_low <= 0.0 <= self.delta_ci_high:
            return f"Delta {pts} is within noise: the {ci} includes 0 ({test})."
        if self.mcnemar_p >= ALPHA:
            return (f"Delta {pts} is within noise: the {ci} excludes 0 but the exact test does not reject "
                    f"({test}); treat the difference as not established.")
        side = "better" if self.delta > 0 else "worse"
        return f"Delta {pts}: the arm is {side} than the base; the {ci} excludes 0 ({test})."

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["within_noise"] = self.within_noise
        return d


def tally_pairs(pairs: Iterable[tuple[bool | None, bool | None]]) -> tuple[int, int, int, int]:
    """(a, b, c, d) over (base right?, arm right?) pairs, a pair with None (not answered) skipped: a both right,
    b base only, c arm only, d both wrong."""
    a = b = c = d = 0
    for base_ok, arm_ok in pairs:
        if base_ok is None or arm_ok is None:
            continue
        if base_ok and arm_ok:
            a += 1
        elif base_ok:
            b += 1
        elif arm_ok:
            c += 1
        else:
            d += 1
    return a, b, c, d


def paired_counts(base: Mapping[int, QuestionRecord], arm: Mapping[int, QuestionRecord]) -> tuple[int, int, int, int]:
    """(a, b, c, d) over ids both runs answered: a both right, b base only, c arm only, d both wrong."""
    def ok(r: QuestionRecord) -> bool | None:
        return bool(r.correct) if r.answered else None

    return tally_pairs((ok(base[q]), ok(arm[q])) for q in sorted(set(base) & set(arm)))


def outcome_counts(base: str, arm: str) -> tuple[int, int, int, int]:
    """(a, b, c, d) from two runs' per-question outcome strings (``Tag.GSM8K_CORRECT``: '1' right, '0' wrong,
    '.' not answered), question by question up to the shorter one."""
    def ok(ch: str) -> bool | None:
        return None if ch == "." else ch == "1"

    return tally_pairs((ok(x), ok(y)) for x, y in zip(base, arm))


def compare_counts(a: int, b: int, c: int, d: int) -> PairedComparison:
    """Paired comparison from the 2x2 table (rows base right/wrong, columns arm right/wrong)."""
    n = a + b + c + d
    if n == 0:
        raise BadInput("no question was answered by both runs: nothing to pair")
    p_base = (a + b) / n
    p_arm = (a + c) / n
    low, high = newcombe_paired_ci(a, b, c, d)
    mcnemar = exact_binomial_two_sided_half(b, b + c)
    return PairedComparison(
        n=n, base_correct=a + b, arm_correct=a + c, both_correct=a, base_only=b, arm_only=c, both_wrong=d,
        base_accuracy=p_base, arm_accuracy=p_arm, delta=p_arm - p_base, delta_ci_low=low, delta_ci_high=high,
        mcnemar_p=mcnemar,
    )


def newcombe_paired_ci(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    """95% interval for p_arm - p_base, Newcombe's method 10.

    With Wilson intervals (l1, u1) for p_arm = (a+c)/n and (l2, u2) for p_base = (a+b)/n and the
    phi correlation of the 2x2 table as Newcombe defines it (cross-product ad - bc shrunk by n/2
    when positive, 0 when a margin is empty):
        L = D - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
        U = D + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)
    """
    n = a + b + c + d
    arm = proportion(a + c, n)
    base = proportion(a + b, n)
    assert arm.p is not None and base.p is not None and arm.ci_low is not None and base.ci_low is not None
    assert arm.ci_high is not None and base.ci_high is not None
    p1, l1, u1 = arm.p, arm.ci_low, arm.ci_high
    p2, l2, u2 = base.p, base.ci_low, base.ci_high
    # table oriented as arm (rows) x base (columns): arm-right&base-right = a, arm-right&base-wrong = c,
    # arm-wrong&base-right = b, arm-wrong&base-wrong = d
    margins = (a + c) * (b + d) * (a + b) * (c + d)
    cross = a * d - b * c
    # Newcombe's phi: a positive cross-product is shrunk by n/2 (0 when within n/2), a negative one kept
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    elif cross > n / 2:
        phi = (cross - n / 2) / math.sqrt(margins)
    else:
        phi = cross / math.sqrt(margins)
    delta = p1 - p2
    lo = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    hi = delta + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, lo), min(1.0, hi)
