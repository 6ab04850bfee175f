"""A step whose every episode failed is a gap in batch/mean_reward (BatchStats logs 0.0 there).
`ludic train`'s reward_curve.png draws it smoothed (plot_curve: EMA 0.6), and the EMA carried
the previous average across the gap: a point drawn at a step no episode was rewarded."""

from __future__ import annotations

import math

import pytest

from ludic.viz.plots import metrics_figure


def test_the_smoothed_curve_leaves_the_failed_step_a_gap() -> None:
    def step(s: int, reward: float, failed: float) -> dict[str, float]:
        return {
            "step": s,
            "batch/mean_reward": reward,
            "batch/num_rollouts": 2.0,
            "batch/num_failed": failed,
        }

    records = [step(1, -2.0, 0.0), step(2, 0.0, 2.0), step(3, -1.0, 1.0), step(4, 0.0, 2.0)]
    (ax,) = metrics_figure(records, smooth=0.6).axes
    raw, smoothed = ax.get_lines()
    for line in (raw, smoothed):
        values = [float(v) for v in line.get_ydata()]
        assert [math.isnan(v) for v in values] == [False, True, False, True]
    # EMA 0.6 over the rewards that exist: -2.0, then 0.6 * -2.0 + 0.4 * -1.0 = -1.6
    assert [float(v) for v in smoothed.get_ydata()][::2] == pytest.approx([-2.0, -1.6], abs=1e-9)
