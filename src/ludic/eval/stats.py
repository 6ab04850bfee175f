"""Intervals over seeds: the mean and its 95% Student-t interval, without scipy.

What it does: `t975(df)` is the 0.975 quantile of Student's t (a table for 1-30 degrees of
freedom, the Cornish-Fisher expansion beyond, within 1e-4 there); `mean_ci95(values)` is the
mean of a few per-seed numbers and the half-width of its two-sided 95% interval. Benchmarks
and examples that report "mean ± 95% interval over seeds" use these, so their intervals agree.
What it does not do: other confidence levels, or intervals for proportions within one run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["mean_ci95", "t975"]

# 0.975 quantiles of Student's t, T975[df - 1] for df = 1..30.
_T975 = (
    *(12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228),
    *(2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086),
    *(2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042),
)
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` >= 1 degrees of freedom."""
    if df < 1:
        raise ValueError(f"a t interval needs df >= 1 (at least 2 values), got df={df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the two-sided 95% t interval of the mean); the half-width is nan
    for a single value (no spread to estimate: there is no interval, not a zero-width one)."""
    if not values:
        raise ValueError("mean_ci95 needs at least one value")
    mean = statistics.fmean(values)
    n = len(values)
    if n < 2:
        return mean, math.nan
    return mean, t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
