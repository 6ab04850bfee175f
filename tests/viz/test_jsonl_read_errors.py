"""What `ludic view` / `ludic plot` say about a file they cannot read (a last line still being
written, a damaged line, a JSON document that is not JSON Lines), the run a plot names, and
a step whose episodes all failed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ludic.rollouts import read_rollouts_jsonl
from ludic.viz.plots import (
    Panel,
    _series,
    default_title,
    metric_panels,
    metrics_figure,
    plot_metrics,
    read_metrics,
)


def test_a_last_line_still_being_written_says_to_read_again(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text('{"id": "a", "ste')
    with pytest.raises(
        ValueError,
        match=r"rollouts\.jsonl:1: not a JSON rollout record .*still writing.*Read it again once the line is finished",
    ):
        read_rollouts_jsonl(rollouts)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    with pytest.raises(
        ValueError,
        match=r"metrics\.jsonl:2: not a JSON metrics record .*still writing.*Read it again",
    ):
        read_metrics(metrics)


def test_a_damaged_line_inside_the_file_says_to_drop_it(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "lo\n{"step": 2, "loss": 1.0}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:1: .*drop the damaged line") as info:
        read_metrics(metrics)
    assert "still writing" not in str(info.value)


def test_an_eval_summary_is_named_and_pointed_to_what_plots_or_views(tmp_path: Path) -> None:
    # `ludic eval` writes metrics.json as one indented JSON object, next to rollouts.jsonl
    summary = tmp_path / "metrics.json"
    summary.write_text(json.dumps({"episodes": 4.0, "success_rate": 0.0}, indent=2) + "\n")
    with pytest.raises(ValueError) as plotted:
        read_metrics(summary)
    assert "not JSON Lines" in str(plotted.value)
    assert "`ludic eval`'s metrics.json" in str(plotted.value)
    assert "metrics.jsonl of `ludic train`" in str(plotted.value)
    assert "mid-write" not in str(plotted.value)
    with pytest.raises(ValueError) as viewed:
        read_rollouts_jsonl(summary)
    assert f"ludic view {tmp_path / 'rollouts.jsonl'}" in str(viewed.value)
    assert "mid-write" not in str(viewed.value)


def test_another_multi_line_json_document_is_named(tmp_path: Path) -> None:
    document = tmp_path / "config.json"
    document.write_text(json.dumps({"a": 1}, indent=2))
    with pytest.raises(ValueError, match=r"config\.json: not JSON Lines .* one JSON document"):
        read_metrics(document)


def test_a_metrics_file_in_the_working_directory_names_it_in_the_title(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `cd RUN && ludic plot metrics.jsonl` titled every figure "(run: .)"
    monkeypatch.chdir(tmp_path)
    title = default_title([Panel(title="Loss", keys=("loss",))], "metrics.jsonl")
    run = title.removeprefix("Loss per training step (run: ").removesuffix(")")
    assert title == f"Loss per training step (run: {run})"  # the folder's name, not "."
    assert run != "." and "/" not in run and tmp_path.name.endswith(run.lstrip("…")), title
    nested = default_title([Panel(title="Loss", keys=("loss",))], "runs/metrics.jsonl")
    assert nested == "Loss per training step (run: runs)"


def test_a_step_whose_episodes_all_failed_is_a_gap_in_the_reward_curve() -> None:
    # BatchStats logs mean_reward 0.0 when every rollout failed: plotted, it drew a reward of 0
    # (above a run's real -10s) that no episode earned
    records = [
        {"step": 1, "batch/mean_reward": -10.0, "batch/num_rollouts": 2.0, "batch/num_failed": 1.0},
        {"step": 2, "batch/mean_reward": 0.0, "batch/num_rollouts": 2.0, "batch/num_failed": 2.0},
        {"step": 3, "batch/mean_reward": 0.0, "batch/num_rollouts": 2.0, "batch/num_failed": 0.0},
    ]
    steps, values = _series(records, "batch/mean_reward")
    assert steps == [1.0, 2.0, 3.0]
    assert values[0] == -10.0 and math.isnan(values[1]) and values[2] == 0.0
    figure = metrics_figure(records, [Panel(title="Reward", keys=("batch/mean_reward",))])
    (line,) = figure.axes[0].get_lines()
    assert math.isnan(line.get_ydata()[1])


@pytest.mark.parametrize("name", ["curves.jpg", "curves.SVG", "curves.pdf"])
def test_an_out_named_like_another_image_format_is_refused(tmp_path: Path, name: str) -> None:
    # `ludic plot metrics.jsonl --out curves.jpg` made a directory curves.jpg/ of PNGs
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n')
    with pytest.raises(ValueError, match=r"the plots are PNGs; give a \.png file"):
        plot_metrics(metrics, tmp_path / name)
    assert not (tmp_path / name).exists()


def test_a_key_without_its_prefix_is_pointed_to_the_logged_name() -> None:
    # the README lists the mismatch metrics as mismatch/k3 ... "under loss/"
    records = [{"step": 1, "loss/mismatch/k3": 1e-10, "loss": 0.5}]
    with pytest.raises(ValueError, match=r"mismatch/k3: did you mean loss/mismatch/k3\?"):
        metric_panels(records, ["mismatch/k3"])
    with pytest.raises(ValueError, match=r"are not in the file; it has") as info:
        metric_panels(records, ["nothing"])
    assert "did you mean" not in str(info.value)
