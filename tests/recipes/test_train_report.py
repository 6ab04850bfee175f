"""`ludic train`'s closing report says how many steps trained nothing, so a run whose every
episode failed does not end on a plain "done" line."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_report import report_run


def _run(tmp_path: Path, history: list[dict[str, float]]) -> str:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(json.dumps({"step": i + 1, **m}) + "\n" for i, m in enumerate(history))
    )
    console = Console(record=True, width=200)
    report_run(TrainConfig(out_dir=tmp_path), history, tmp_path / "checkpoints" / "step_2", console)
    return console.export_text()


def test_every_step_skipped_is_said(tmp_path: Path) -> None:
    history = [{"batch/mean_reward": 0.0, "skipped_empty": 1.0}] * 2
    text = _run(tmp_path, history)
    assert "2 of 2 steps trained nothing" in text
    assert "the model is the one this run started from" in text


def test_some_steps_skipped_are_counted(tmp_path: Path) -> None:
    history = [
        {"batch/mean_reward": 0.0, "skipped_nonfinite": 1.0},
        {"batch/mean_reward": 0.5, "skipped_empty": 0.0},
    ]
    text = _run(tmp_path, history)
    assert "1 of 2 steps trained nothing" in text
    assert "started from" not in text


def test_no_step_skipped_says_nothing_of_it(tmp_path: Path) -> None:
    text = _run(tmp_path, [{"batch/mean_reward": 0.5}])
    assert "trained nothing" not in text
