"""The accuracy budget verdict: is an arm within B points of its baseline, on paired questions?

Δ = arm − base (a fraction of questions). Against a budget B (``1pp`` = 0.01) a comparison is

* ``within``   when the whole interval for Δ lies above −B,
* ``exceeds``  when the whole interval lies below −B,
* ``undecided`` otherwise — with the questions it would be expected to take, at the measured discordance.

Two methods, both two-sided 95% (so each one-sided claim errs with probability at most α/2 = 0.025):

* **fixed n** (``eval compare --budget``): Newcombe's paired interval (method 10, :mod:`quantrack.accuracy.stats`)
  on every paired question. Valid only when n was fixed before looking; looking after every batch and stopping
  when it settles makes its error grow with every look.
* **sequential** (``--sequential``, and a study with ``[eval] budget``): a confidence sequence by *testing by betting*
  (Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by betting", JRSS-B 86(1):1-27).
  The paired difference of question i is X_i = arm_i − base_i ∈ {−1, 0, +1} (rescaled to [0, 1] it is their bounded
  mean). For each candidate m a gambler bets against "E[X] <= m" with capital K_t(m) = Π (1 + λ_i (X_i − m)) and
  one against "E[X] >= m" with Π (1 − λ_i (X_i − m)); the bets λ_i >= 0 are predictable (from the first i − 1
  questions only: the aGRAPA bet of the paper, §5.3, λ = (μ̂ − m) / (σ̂² + (μ̂ − m)²), truncated at c / (1 ± m)
  with c = 1/2). Under the null each capital is a nonnegative supermartingale, so by Ville's inequality it ever
  reaches 2/α with probability at most α/2: the set of m not yet rejected (running intersection) is a 95%
  confidence sequence, valid at every question at once — a user may look after every answer and stop when it
  settles. Questions are taken as a random sample (a study asks them in a seeded random order).

The price of validity under optional stopping is width: at 5% discordance and Δ = 0 the fixed-n interval clears
1 point at about 3,900 questions with 80% power, the sequence at a median of about 5,000 (measured by
``bench/budget_sim.py``, figures in docs/accuracy.md).

No scipy: ``compare``/``report`` must start fast; numpy arrives with pandas.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from quantrack.accuracy.stats import ALPHA, Z_975, PairedComparison

Verdict = Literal["within", "exceeds", "undecided"]
VERDICTS: tuple[Verdict, ...] = ("within", "exceeds", "undecided")
FIXED = "fixed-n"
SEQUENTIAL = "sequential"
METHODS = (FIXED, SEQUENTIAL)
FIXED_METHOD = "fixed n: Newcombe (1998) method 10 paired 95% interval on all paired questions"
SEQ_METHOD = ("sequential: betting confidence sequence, aGRAPA bets (Waudby-Smith & Ramdas 2024, JRSS-B), "
              "95%, valid under optional stopping")
TRUNCATION = 0.5  # c of the paper: a bet never risks more than half the capital
GRID_STEP = 0.0005  # the confidence sequence's interval is read on this grid of m (0.05 points)


@dataclass(frozen=True)
class BudgetVerdict:
    verdict: Verdict
    budget_pp: float
    low: float | None  # interval for Δ in points (as budget_pp), at questions_used
    high: float | None
    questions_used: int  # paired questions the verdict rests on (the first at which it settled, sequentially)
    method: str  # FIXED or SEQUENTIAL
    method_detail: str
    alpha: float
    questions_available: int  # paired questions there were
    more_questions: int | None = None  # when undecided: expected further paired questions to settle; None = unknown
    more_reason: str = ""  # how more_questions was found, or why it is unknown

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        """The one line a reader gets; as strong as the evidence and no stronger."""
        iv = ("" if self.low is None or self.high is None
              else f" (95% {'confidence sequence' if self.method == SEQUENTIAL else 'interval'} "
                   f"[{self.low:+.2f}, {self.high:+.2f}] pts)")
        b = f"{self.budget_pp:g} pt{'s' if self.budget_pp != 1 else ''}"
        if self.verdict == "within":
            return f"within a {b} budget{iv}, settled at {self.questions_used:,} paired questions ({self.method})"
        if self.verdict == "exceeds":
            return f"exceeds a {b} budget{iv}, settled at {self.questions_used:,} paired questions ({self.method})"
        more = (f"; about {self.more_questions:,} more paired questions expected to settle it ({self.more_reason})"
                if self.more_questions is not None else f"; {self.more_reason}" if self.more_reason else "")
        return (f"undecided against a {b} budget{iv} at n = {self.questions_used:,}: a loss of more than {b} "
                f"is not excluded, nor is a loss within it{more}")


# ---------------------------------------------------------------------------------------------- fixed n


def fixed_verdict(pc: PairedComparison, budget: float, alpha: float = ALPHA) -> BudgetVerdict:
    """The verdict from Newcombe's interval on all ``pc.n`` paired questions (``alpha`` other than 0.05 is refused:
    the interval is a 95% one)."""
    _check(budget, alpha)
    if alpha != ALPHA:
        raise ValueError("the fixed-n verdict uses the 95% Newcombe interval (alpha 0.05); use the sequential one")
    low, high = pc.delta_ci_low, pc.delta_ci_high
    verdict = _from_interval(low, high, budget)
    more: int | None = None
    reason = ""
    if verdict == "undecided":
        more, reason = _fixed_more(pc, budget)
    return BudgetVerdict(verdict, round(budget * 100, 6), _pp(low), _pp(high), pc.n, FIXED, FIXED_METHOD, alpha,
                         pc.n, more, reason)


def _pp(v: float | None) -> float | None:
    return None if v is None else round(v * 100, 4)


def _fixed_more(pc: PairedComparison, budget: float) -> tuple[int | None, str]:
    n = pc.n
    disc = (pc.base_only + pc.arm_only) / n
    d = pc.delta
    var = disc - d * d
    gap = abs(d + budget)
    if var <= 0 or gap < 1e-12:
        return None, "the measured Δ sits on the budget line: no number of questions is expected to settle it"
    need = math.ceil((Z_975 * math.sqrt(var) / gap) ** 2)
    return max(1, need - n), (f"fixed-n planning at the measured Δ {d * 100:+.2f} pts and discordance "
                              f"{disc * 100:.1f}%; the interval then just clears the line half the time")


def _from_interval(low: float, high: float, budget: float) -> Verdict:
    if low > -budget:
        return "within"
    if high < -budget:
        return "exceeds"
    return "undecided"


def _check(budget: float, alpha: float) -> None:
    if not (math.isfinite(budget) and 0 < budget < 1):
        raise ValueError(f"budget {budget!r}: a fraction between 0 and 1 (0.01 = 1 point)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha {alpha!r}: between 0 and 1")


# ---------------------------------------------------------------------------------------------- sequential


def paired_differences(pairs: Iterable[tuple[bool | None, bool | None]]) -> list[int]:
    """X_i = arm_i − base_i over (base right?, arm right?) pairs in the order given; a pair with None skipped."""
    return [int(bool(a)) - int(bool(b)) for b, a in pairs if b is not None and a is not None]


class SequentialMonitor:
    """The sequential test at m = −budget, one paired question at a time (O(1) per question): what a study checks
    after every answer to stop an arm. :func:`sequential_verdict` settles at the same question."""

    def __init__(self, budget: float, alpha: float = ALPHA) -> None:
        _check(budget, alpha)
        self.m = -budget
        self.thresh = math.log(2 / alpha)
        self.log_up = 0.0
        self.log_dn = 0.0
        self.t = 0
        self.s = 0.0
        self.ss = 0.0
        self.verdict: Verdict = "undecided"
        self.settled_at: int | None = None

    def add(self, x: int) -> Verdict | None:
        """Take X = arm − base of the next question; the verdict once settled (it then stays), else None."""
        if self.settled_at is not None:
            return self.verdict
        mu, var = self.s / (self.t + 1), (0.25 + self.ss) / (self.t + 1)
        gap = mu - self.m
        raw = gap / (var + gap * gap)
        self.log_up += math.log1p(min(max(raw, 0.0), TRUNCATION / (1 + self.m)) * (x - self.m))
        self.log_dn += math.log1p(-min(max(-raw, 0.0), TRUNCATION / (1 - self.m)) * (x - self.m))
        new_mean = (self.s + x) / (self.t + 2)
        self.ss += (x - mu) * (x - new_mean)
        self.s += x
        self.t += 1
        if self.log_up >= self.thresh:
            self.verdict, self.settled_at = "within", self.t
        elif self.log_dn >= self.thresh:
            self.verdict, self.settled_at = "exceeds", self.t
        return self.verdict if self.settled_at is not None else None


def sequential_verdict(diffs: Sequence[int], budget: float, alpha: float = ALPHA) -> BudgetVerdict:
    """The verdict of the betting test, read question by question in the order given: the first question at which
    the hypothesis "Δ <= −budget" (or "Δ >= −budget") is rejected settles it, and later questions are not used, as
    a study that stopped there would not have asked them. The interval shown is the confidence sequence (every m
    not rejected by either bet, running intersection) at that question."""
    import numpy as np

    _check(budget, alpha)
    x = np.asarray(diffs, dtype=float)
    n = len(x)
    if n == 0:
        return BudgetVerdict("undecided", round(budget * 100, 6), None, None, 0, SEQUENTIAL, SEQ_METHOD, alpha, 0,
                             None, "no paired question")
    if not np.all(np.isin(x, (-1.0, 0.0, 1.0))):
        raise ValueError("paired differences must be -1, 0 or +1")
    mon = SequentialMonitor(budget, alpha)
    for xi in x:
        if mon.add(int(xi)) is not None:
            break
    used = mon.settled_at if mon.settled_at is not None else n
    grid = np.arange(-1 + GRID_STEP, 1 - GRID_STEP / 2, GRID_STEP)
    log_up = np.zeros_like(grid)
    log_dn = np.zeros_like(grid)
    rej = np.zeros(grid.shape, dtype=bool)
    s = ss = 0.0
    for t in range(used):
        mu, var = s / (t + 1), (0.25 + ss) / (t + 1)
        lam_up, lam_dn = _bets(mu, var, grid)
        xt = x[t]
        log_up += np.log1p(lam_up * (xt - grid))
        log_dn += np.log1p(-lam_dn * (xt - grid))
        rej |= (log_up >= mon.thresh) | (log_dn >= mon.thresh)
        new_mean = (s + xt) / (t + 2)
        ss += (xt - mu) * (xt - new_mean)
        s += xt
    alive = ~rej
    low = float(grid[alive].min()) if alive.any() else None
    high = float(grid[alive].max()) if alive.any() else None
    more: int | None = None
    reason = ""
    if mon.verdict == "undecided":
        more, reason = _sequential_more(x, budget, mon.thresh, mon.log_up, mon.log_dn)
    return BudgetVerdict(mon.verdict, round(budget * 100, 6), _pp(low), _pp(high), used, SEQUENTIAL, SEQ_METHOD,
                         alpha, n, more, reason)


def _bets(mu: float, var: float, m: Any) -> tuple[Any, Any]:
    """aGRAPA bets for every m, truncated to [0, c/(1 ± m)] so the capital stays positive."""
    import numpy as np

    gap = mu - m
    raw = gap / (var + gap * gap)
    up = np.clip(raw, 0.0, TRUNCATION / (1.0 + m))
    dn = np.clip(-raw, 0.0, TRUNCATION / (1.0 - m))
    return up, dn


def growth_rate(p_minus: float, p_zero: float, p_plus: float, m: float, upward: bool) -> float:
    """max over admissible λ of E log(1 + λ (X − m)) (upward) or E log(1 − λ (X − m)) for X on {−1, 0, 1} with
    these probabilities: the capital's expected growth per question with the best constant bet (Kelly)."""
    sign = 1.0 if upward else -1.0
    ys = [sign * (v - m) for v in (-1.0, 0.0, 1.0)]
    ps = (p_minus, p_zero, p_plus)
    cap = TRUNCATION / (1.0 + m) if upward else TRUNCATION / (1.0 - m)

    def f(lam: float) -> float:
        return sum(p * math.log1p(lam * y) for p, y in zip(ps, ys) if p > 0)

    lo, hi = 0.0, cap  # f is concave: golden-section search
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if f(a) < f(b):
            lo = a
        else:
            hi = b
    return max(0.0, f((lo + hi) / 2))


def _sequential_more(x: Any, budget: float, thresh: float, log_up: float, log_dn: float) -> tuple[int | None, str]:
    n = len(x)
    p_minus = float((x == -1).sum()) / n
    p_plus = float((x == 1).sum()) / n
    p_zero = 1.0 - p_minus - p_plus
    d = p_plus - p_minus
    upward = d > -budget
    rate = growth_rate(p_minus, p_zero, p_plus, -budget, upward)
    if rate <= 1e-9:
        return None, "the measured Δ sits on the budget line: no number of questions is expected to settle it"
    have = log_up if upward else log_dn
    more = max(1, math.ceil((thresh - have) / rate))
    side = "within" if upward else "exceeds"
    return more, (f"toward '{side}', at the measured Δ {d * 100:+.2f} pts and discordance "
                  f"{(p_minus + p_plus) * 100:.1f}% (capital growth per question {rate:.2e}; Wald's approximation)")


# ---------------------------------------------------------------------------------------------- simulation


def simulate(delta: float, discordance: float, budget: float, *, runs: int, max_questions: int, seed: int,
             alpha: float = ALPHA) -> dict[str, Any]:
    """Many sequences of paired questions with a known Δ and discordance, each judged by the sequential verdict
    (only its test at −budget, vectorized over the runs): the share declared within / exceeds and the questions
    each needed. The same bets and thresholds as :func:`sequential_verdict`, which the tests check."""
    import numpy as np

    _check(budget, alpha)
    if not (0 <= discordance <= 1 and abs(delta) <= discordance):
        raise ValueError("need |delta| <= discordance <= 1")
    p_plus = (discordance + delta) / 2
    p_minus = (discordance - delta) / 2
    rng = np.random.default_rng(seed)
    m = -budget
    thresh = math.log(2 / alpha)
    log_up = np.zeros(runs)
    log_dn = np.zeros(runs)
    s = np.zeros(runs)
    ss = np.zeros(runs)
    settled = np.zeros(runs, dtype=int)  # 0 = not yet
    side = np.zeros(runs, dtype=int)  # +1 within, -1 exceeds
    for t in range(max_questions):
        u = rng.random(runs)
        xt = np.where(u < p_plus, 1.0, np.where(u < p_plus + p_minus, -1.0, 0.0))
        mu = s / (t + 1)
        var = (0.25 + ss) / (t + 1)
        gap = mu - m
        raw = gap / (var + gap * gap)
        live = settled == 0
        log_up += np.where(live, np.log1p(np.clip(raw, 0, TRUNCATION / (1 + m)) * (xt - m)), 0.0)
        log_dn += np.where(live, np.log1p(-np.clip(-raw, 0, TRUNCATION / (1 - m)) * (xt - m)), 0.0)
        new_mean = (s + xt) / (t + 2)
        ss += (xt - mu) * (xt - new_mean)
        s += xt
        up = live & (log_up >= thresh)
        dn = live & ~up & (log_dn >= thresh)
        settled[up | dn] = t + 1
        side[up] = 1
        side[dn] = -1
        if not (settled == 0).any():
            break
    used = settled[settled > 0]
    return {
        "delta": delta, "discordance": discordance, "budget": budget, "runs": runs, "max_questions": max_questions,
        "within": float((side == 1).mean()), "exceeds": float((side == -1).mean()),
        "undecided": float((side == 0).mean()),
        "median_questions": float(np.median(used)) if len(used) else None,
        "p90_questions": float(np.percentile(used, 90)) if len(used) else None,
    }


PLAN_PRIORS = ((0.0, 0.03), (0.0, 0.05), (0.0, 0.08), (0.0, 0.11), (-0.03, 0.11))  # (Δ, discordance), fractions


def expected_questions(delta: float, discordance: float, budget: float, alpha: float = ALPHA) -> int | None:
    """Questions the sequential test is expected to need to settle at a true Δ and discordance (fractions): Wald's
    approximation log(2/α) / g, g the best constant bet's growth rate per question toward the side Δ lies on (a
    planning figure, derived; None when the test cannot settle: Δ exactly on the line)."""
    _check(budget, alpha)
    if not (0 <= discordance <= 1 and abs(delta) <= discordance):
        raise ValueError("need |delta| <= discordance <= 1")
    m = -budget
    p_plus, p_minus = (discordance + delta) / 2, (discordance - delta) / 2
    g = growth_rate(p_minus, 1 - discordance, p_plus, m, upward=delta > m)
    return math.ceil(math.log(2 / alpha) / g) if g > 1e-12 else None


def plan_lines(budget: float, pool: int, arms: list[str], alpha: float = ALPHA) -> list[str]:
    """``preflight --study``'s budget plan: expected questions per arm to settle, under stated priors (derived)."""
    out = [(f"budget plan (derived, Wald's approximation for the sequential test at {1 - alpha:.0%}): a "
            f"{budget * 100:g}-point budget, pool {pool:,} questions;"),
           f"  the baseline answers all {pool:,}; each of {', '.join(arms) or 'no other arm'} stops when settled.",
           "  Expected questions per arm under stated priors:"]
    for d, disc in PLAN_PRIORS:
        n = expected_questions(d, disc, budget, alpha)
        if n is None:
            fits = "never settles"
        elif n <= 0.6 * pool:
            fits = f"{n:,} (inside the pool)"
        elif n <= pool:
            fits = f"{n:,} (close to the pool: 'undecided' is likely in many runs)"
        else:
            fits = f"{n:,} (more than the pool: expect 'undecided')"
        out.append(f"  true Δ {d * 100:+.1f} pts, discordance {disc:.0%}: {fits}")
    out.append("  (discordance: the share of questions two runs answer differently; two bf16 servers of one "
               "configuration ~3%, a quantized arm more: measure it with a short run and `eval compare`)")
    return out


__all__ = [
    "FIXED",
    "METHODS",
    "PLAN_PRIORS",
    "SEQUENTIAL",
    "VERDICTS",
    "BudgetVerdict",
    "SequentialMonitor",
    "expected_questions",
    "fixed_verdict",
    "growth_rate",
    "paired_differences",
    "plan_lines",
    "sequential_verdict",
    "simulate",
]
