"""The step axis of `metrics_figure` has whole-number ticks: a 3-step run is not drawn with
ticks at 1.25, 1.5, 1.75 (what `ludic plot` showed for a short run)."""

from __future__ import annotations

from ludic.viz import metrics_figure


def test_a_short_run_has_only_whole_step_ticks() -> None:
    records = [{"step": s, "loss": 1.0 / s, "reward_mean": -s} for s in (1, 2, 3)]
    fig = metrics_figure(records)
    fig.canvas.draw()  # ticks are placed at draw time
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
