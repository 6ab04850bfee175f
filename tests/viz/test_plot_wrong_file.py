"""`ludic plot` given the wrong file of a run says which file it is and what to run instead
(the mirror of `ludic view` given metrics.jsonl): a rollouts JSONL points to `ludic view`, a
samples JSONL to the metrics file, and a path that does not exist says where `ludic train`
writes its metrics, instead of "the records have []" or a bare errno."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from viz_fakes import advantage_samples, snapshot_rollout

from ludic.rollouts import write_rollouts_jsonl
from ludic.viz import PlotConfig, plot_command


def _plot(path: Path) -> str:
    with pytest.raises(ValueError) as e:
        plot_command(PlotConfig(metrics=path))
    return str(e.value)


def test_plotting_a_rollouts_jsonl_points_to_ludic_view(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    write_rollouts_jsonl([snapshot_rollout()], path)
    message = _plot(path)
    assert "rollout" in message and f"ludic view {path}" in message, message
    assert "metrics.jsonl" in message, message


def test_plotting_a_samples_jsonl_names_it_and_the_metrics_file(tmp_path: Path) -> None:
    path = tmp_path / "samples.jsonl"
    samples = advantage_samples([snapshot_rollout()])
    path.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in samples))
    message = _plot(path)
    assert "training sample" in message and "metrics.jsonl" in message, message


def test_plotting_a_missing_file_says_where_metrics_are_written(tmp_path: Path) -> None:
    message = _plot(tmp_path / "nope.jsonl")
    assert "no metrics file at" in message and "metrics.jsonl" in message, message


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_empty_metrics_file_says_it_has_no_record_yet(tmp_path: Path, text: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)  # a run that has not finished its first step
    message = _plot(path)
    assert f"{path} holds no metrics record yet" in message, message
    assert "the records have []" not in message, message
