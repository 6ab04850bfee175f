"""What `ludic view` / `ludic plot` say about a file they cannot read (a last line still being
written, a damaged line, a JSON document that is not JSON Lines), and the run a plot names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.rollouts import read_rollouts_jsonl
from ludic.viz.plots import Panel, default_title, read_metrics


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
    assert title == f"Loss per training step (run: {tmp_path.name})"
    nested = default_title([Panel(title="Loss", keys=("loss",))], "runs/metrics.jsonl")
    assert nested == "Loss per training step (run: runs)"
