"""`ludic plot` titles a figure "<panels> per training step (run: <run directory>)"; an absolute
run directory ran off a one-panel figure (520 pixels wide). A long path is shortened to its last
components after "…/" (a long name to its end after "…") so the title fits the figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.viz.plots import Panel, default_title, metrics_figure

REWARD = Panel(title="Reward", keys=("batch/mean_reward",))
LENGTH = Panel(title="Completion length", keys=("completion_len",))
RECORDS = [{"step": s, "batch/mean_reward": -1.0, "completion_len": 3.0} for s in (1, 2)]


def title_fits(title: str, panels: list[Panel]) -> bool:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    figure = metrics_figure(RECORDS, panels, title=title)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    (text,) = [t for t in figure.findobj(Text) if t.get_text() == title]
    box = text.get_window_extent(canvas.get_renderer())
    return box.x0 >= 0 and box.x1 <= figure.bbox.width


DEEP = "/home/someone/experiments/2026-11-27/ludic_runs/grpo_tictactoe/metrics.jsonl"


@pytest.mark.parametrize("panel", [REWARD, LENGTH])
def test_an_absolute_run_path_is_shortened_to_fit_a_one_panel_figure(panel: Panel) -> None:
    assert not title_fits(f"{panel.title} per training step (run: {Path(DEEP).parent})", [panel])
    title = default_title([panel], DEEP)
    assert title_fits(title, [panel]), title
    assert title.startswith(f"{panel.title} per training step (run: …")
    run = title.removeprefix(f"{panel.title} per training step (run: …").removesuffix(")")
    assert len(run) > 3 and str(Path(DEEP).parent).endswith(run)


def test_the_shortened_path_keeps_as_many_last_components_as_fit() -> None:
    assert default_title([REWARD], DEEP) == "Reward per training step (run: …/grpo_tictactoe)"
    three = default_title([REWARD, LENGTH, Panel(title="Loss", keys=("loss",))], DEEP)
    assert three.endswith("(run: /home/someone/experiments/2026-11-27/ludic_runs/grpo_tictactoe)")


def test_a_long_name_keeps_its_end() -> None:
    name = "a_run_whose_directory_name_alone_is_too_long_for_one_panel"
    title = default_title([REWARD], f"/runs/{name}/metrics.jsonl")
    assert title_fits(title, [REWARD]), title
    run = title.removeprefix("Reward per training step (run: ").removesuffix(")")
    assert run.startswith("…") and name.endswith(run.removeprefix("…")) and len(run) > 5


def test_a_short_path_is_kept_whole() -> None:
    assert default_title([REWARD], "ludic_runs/train/metrics.jsonl") == (
        "Reward per training step (run: ludic_runs/train)"
    )
    assert default_title([REWARD], "/r/metrics.jsonl") == "Reward per training step (run: /r)"
