"""`ludic train` whose every episode failed says "fix the cause and run again", but it has
saved its final checkpoint (the unchanged model) by then, so the same command in the same
--out-dir was refused ("holds an earlier run's checkpoints") and a resumed one had no step
left. The refusal now says how to run again: another --out-dir or delete it, or, resumed, a
larger --steps, naming the checkpoint it saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ludic.recipes.configs import TrainConfig
from ludic.recipes.train_report import NothingTrainedError, report_run
from ludic.recipes.training import check_run_dir

ALL_FAILED = {"batch/mean_reward": 0.0, "skipped_empty": 1.0}
ALL_FAILED |= {"batch/num_rollouts": 2.0, "batch/num_failed": 2.0}


def saved_checkpoint(out_dir: Path) -> Path:
    step = out_dir / "checkpoints" / "step_00000001"
    (step / "model").mkdir(parents=True)
    (step / "MANIFEST.json").write_text("{}")  # a finished save, as finish() leaves it
    return step


def refusal(cfg: TrainConfig, checkpoint: Path) -> str:
    with pytest.raises(NothingTrainedError) as caught:
        report_run(cfg, [ALL_FAILED], checkpoint, Console(record=True, width=200))
    return str(caught.value)


def test_a_fresh_run_names_another_out_dir_since_the_same_one_is_now_refused(
    tmp_path: Path,
) -> None:
    checkpoint = saved_checkpoint(tmp_path)
    message = refusal(TrainConfig(out_dir=tmp_path), checkpoint)
    assert f"run again with another --out-dir, or delete {tmp_path} first" in message
    assert str(checkpoint) in message
    # what running the same command again meets (the premise of the advice)
    with pytest.raises(FileExistsError, match="holds an earlier run's checkpoints"):
        check_run_dir(tmp_path, None)


def test_a_resumed_run_names_a_larger_steps(tmp_path: Path) -> None:
    checkpoint = saved_checkpoint(tmp_path)
    message = refusal(TrainConfig(out_dir=tmp_path, resume="latest"), checkpoint)
    assert "resume again with a larger --steps" in message and str(checkpoint) in message
    assert "another --out-dir" not in message
