"""`ludic train` whose every step was skipped because every episode failed (a run shorter than
the 5-step stall limit) used to exit 0 on "done: mean episode reward +0.000". It now refuses
(one line, exit 1 in the CLI): no step trained, why, this run's first error and where the
episodes are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from ludic.errors import is_refusal
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_report import NothingTrainedError, report_run
from ludic.rollouts import append_rollouts_jsonl
from ludic.types import Rollout

ALL_FAILED = {"batch/mean_reward": 0.0, "skipped_empty": 1.0}
ALL_FAILED |= {"batch/num_rollouts": 2.0, "batch/num_failed": 2.0}


def failed(message: str) -> Rollout:
    return Rollout(meta={"error": message, "error_type": "KeyError", "error_phase": "run"})


def report(tmp_path: Path, history: list[dict[str, float]]) -> str:
    console = Console(record=True, width=200)
    report_run(TrainConfig(out_dir=tmp_path), history, tmp_path / "checkpoints" / "step_2", console)
    return console.export_text()


def test_every_episode_failing_in_every_step_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "rollouts.jsonl"
    append_rollouts_jsonl([Rollout(), failed("'from an earlier run'")], log)  # before a resume
    append_rollouts_jsonl([failed("'lamps'"), failed("'lamps'")] * 2, log)
    with pytest.raises(NothingTrainedError) as caught:
        report(tmp_path, [ALL_FAILED, ALL_FAILED])
    message = str(caught.value)
    assert is_refusal(caught.value)
    assert message.startswith("no step trained: every episode of all 2 step(s) failed")
    assert "The first: KeyError: 'lamps'." in message and "earlier run" not in message
    assert f"in {log} (meta['error'], meta['error_traceback']" in message


def test_without_a_rollouts_file_it_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(NothingTrainedError, match=r"failed, so the model is the one this run"):
        report(tmp_path, [ALL_FAILED])


def test_a_step_with_an_episode_that_ran_is_reported_as_before(tmp_path: Path) -> None:
    some_ran = {**ALL_FAILED, "batch/num_failed": 1.0}
    rows = [{"step": i + 1, **m} for i, m in enumerate([ALL_FAILED, some_ran])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    text = report(tmp_path, [ALL_FAILED, some_ran])
    assert text.startswith("done: mean episode reward") and "2 of 2 steps trained nothing" in text
