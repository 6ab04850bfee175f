"""t975 and mean_ci95: the quantiles checked against the t distribution itself (numerical CDF)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from ludic.eval.stats import mean_ci95, t975


def t_cdf(x: float, df: int, steps: int = 20_000) -> float:
    """P(T <= x) for x > 0: 1/2 plus Simpson's rule on the density over [0, x]."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(t: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))

    h = x / steps
    total = density(0.0) + density(x)
    total += sum((4 if i % 2 else 2) * density(i * h) for i in range(1, steps))
    return 0.5 + total * h / 3


@pytest.mark.parametrize("df", [1, 2, 5, 11, 12, 29, 30, 31, 45, 100, 1000])
def test_t975_is_the_0975_quantile(df: int) -> None:
    # the table has 3 decimals: P moves by ~density * 5e-4 < 2e-4 around the quantile
    assert t_cdf(t975(df), df) == pytest.approx(0.975, abs=2e-4)


def test_t975_decreases_to_the_normal_quantile_and_refuses_df_0() -> None:
    values = [t975(df) for df in range(1, 200)]
    assert all(a > b for a, b in itertools.pairwise(values))
    assert t975(10**6) == pytest.approx(1.96, abs=1e-4)
    with pytest.raises(ValueError, match="df >= 1"):
        t975(0)


def test_mean_ci95() -> None:
    values = [0.0, 1.0] * 6  # 12 values, 11 d.o.f.
    mean, half = mean_ci95(values)
    assert mean == 0.5
    assert half == pytest.approx(2.201 * statistics.stdev(values) / math.sqrt(12))
    mean, half = mean_ci95([3.0])  # one value: no interval, not a zero-width one
    assert mean == 3.0 and math.isnan(half)
    with pytest.raises(ValueError, match="at least one"):
        mean_ci95([])
