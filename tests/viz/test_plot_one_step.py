"""A metrics file of one step (a run's first, plotted while it trains on) gets whole-number step
ticks too: matplotlib's integer locator falls back to 0.945, 0.96, ... when the view holds fewer
than two integers, which is what `ludic plot` drew for a run one step in."""

from __future__ import annotations

from ludic.viz import metrics_figure


def test_one_step_is_drawn_with_whole_step_ticks() -> None:
    fig = metrics_figure([{"step": 1, "loss": 0.5, "reward_mean": -1.0}])
    fig.canvas.draw()  # ticks are placed at draw time
    for ax in fig.axes:
        low, high = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if low <= t <= high]
        assert shown == [1.0], shown
