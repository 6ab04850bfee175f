"""`ludic train`'s closing line ("done: mean episode reward X -> Y") and its TrainResult read
batch/mean_reward, which BatchStats logs as 0.0 on a step whose every episode failed. Such a
step is no reward: the line quotes the first and last step that had a successful episode (the
rule `ludic plot` gaps by), or says that no step had one."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_report import TrainResult, report_run

ALL_FAILED = {"batch/mean_reward": 0.0, "batch/num_rollouts": 2.0, "batch/num_failed": 2.0}


def ran(reward: float) -> dict[str, float]:
    return {"batch/mean_reward": reward, "batch/num_rollouts": 2.0, "batch/num_failed": 0.0}


def report(tmp_path: Path, history: list[dict[str, float]], step: int) -> tuple[str, TrainResult]:
    rows = [{"step": step - len(history) + i + 1, **m} for i, m in enumerate(history)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    console = Console(record=True, width=300)
    checkpoint = tmp_path / "checkpoints" / f"step_{step}"
    result = report_run(TrainConfig(out_dir=tmp_path), history, checkpoint, console)
    return console.export_text(), result


def test_failed_first_and_last_steps_are_not_quoted_as_reward_0(tmp_path: Path) -> None:
    skipped = {**ALL_FAILED, "skipped_empty": 1.0}
    text, result = report(tmp_path, [skipped, ran(-1.0), ran(-0.5), skipped], step=4)
    assert text.startswith(
        "done: mean episode reward -1.000 (step 2) -> -0.500 (step 3), the first and last step "
        "with a successful episode (2 steps of this launch had none)."
    )
    assert (result.first_reward, result.last_reward) == (-1.0, -0.5)


def test_after_a_resume_the_steps_are_the_runs(tmp_path: Path) -> None:
    text, result = report(tmp_path, [ran(-2.0), ran(-1.5), ALL_FAILED], step=13)
    assert "-2.000 (step 11) -> -1.500 (step 12), the first and last step" in text
    assert "(1 step of this launch had none)" in text
    assert (result.first_reward, result.last_reward) == (-2.0, -1.5)


def test_no_step_with_a_successful_episode_is_said_plainly(tmp_path: Path) -> None:
    # Every episode failed but the steps did not say they were skipped, so the run is not
    # refused as NothingTrainedError: the closing line still must not quote +0.000.
    text, result = report(tmp_path, [ALL_FAILED, ALL_FAILED], step=2)
    assert text.startswith("done: mean episode reward unknown: no step had a successful episode.")
    assert math.isnan(result.first_reward) and math.isnan(result.last_reward)


def test_steps_that_all_had_an_episode_read_as_before(tmp_path: Path) -> None:
    some_failed = {**ran(-0.25), "batch/num_failed": 1.0}
    text, result = report(tmp_path, [ran(-1.0), some_failed], step=2)
    assert text.startswith("done: mean episode reward -1.000 (step 1) -> -0.250 (step 2).")
    assert (result.first_reward, result.last_reward) == (-1.0, -0.25)
