"""Summary statistics for measured samples: median, mean, 95% CI of the mean, percentiles.

Pure arithmetic. scipy is imported only inside :func:`summarize` (for the Student t quantile),
so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks.

    Same definition as numpy's default (``method="linear"``): position ``(n - 1) * q / 100``
    in the sorted values.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


@dataclass(frozen=True)
class Summary:
    """Statistics of one measured quantity across samples (same unit as the samples)."""

    n: int
    mean: float
    median: float
    std: float | None  # sample standard deviation (ddof=1); None for n < 2
    ci95_low: float | None  # 95% CI of the mean, Student t with n-1 dof; None for n < 2
    ci95_high: float | None
    p90: float
    p99: float
    min: float
    max: float
    p95: float = math.nan  # after the others: positional construction of older callers stays valid

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary | None:
    """Summarize samples; ``None`` when there are none (never a made-up zero)."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return None
    mean = math.fsum(vals) / n
    std: float | None = None
    lo: float | None = None
    hi: float | None = None
    if n >= 2:
        from scipy import stats as sps  # type: ignore[import-untyped]

        std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
        half = float(sps.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
        lo, hi = mean - half, mean + half
    return Summary(
        n=n,
        mean=mean,
        median=median(vals),
        std=std,
        ci95_low=lo,
        ci95_high=hi,
        p90=percentile(vals, 90.0),
        p99=percentile(vals, 99.0),
        min=min(vals),
        max=max(vals),
        p95=percentile(vals, 95.0),
    )


def pct_diff(measured: float, reference: float) -> float:
    """(measured - reference) / reference, in percent."""
    if reference == 0:
        raise ZeroDivisionError("reference is zero")
    return (measured - reference) / reference * 100.0
