"""README walk (walkC), "Decoupled actor and learner over Redis": `--steps` may change on a
resume, but one the newest checkpoint already reached left nothing to train. The learner
loaded its model, reached Redis and the server, then ended with exit code 0 and the line
`learner done at step 6: {}`; `ludic train --resume` refuses the same before loading."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.learner_settings import (
    LEARNER_SETTINGS_KEY,
    check_learner_resume,
    learner_settings,
)
from ludic.training.checkpoint import STATE
from ludic.training.checkpoint_manifest import MANIFEST


def _learner_run(out_dir: Path, step: int) -> LearnerConfig:
    """A learner config and, in its out-dir, a checkpoint at `step` saved with its settings."""
    cfg = LearnerConfig(out_dir=out_dir, steps=step)
    path = out_dir / "checkpoints" / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    extra = {LEARNER_SETTINGS_KEY: learner_settings(cfg)}
    (path / STATE).write_text(json.dumps({"step": step, "extra": extra}))
    return cfg


@pytest.mark.parametrize("steps", [4, 6])
def test_a_resume_at_or_below_the_checkpoints_step_is_refused(tmp_path: Path, steps: int) -> None:
    cfg = dataclasses.replace(_learner_run(tmp_path / "run", 6), steps=steps)
    with pytest.raises(ValueError) as refused:
        check_learner_resume(cfg)
    text = str(refused.value)
    assert "step_00000006" in text and "is at step 6" in text, text
    assert f"--steps is {steps}" in text and "nothing is left to train" in text, text
    assert "pass --steps above 6" in text, text


def test_a_resume_with_steps_left_goes_on(tmp_path: Path) -> None:
    cfg = dataclasses.replace(_learner_run(tmp_path / "run", 6), steps=7)
    check_learner_resume(cfg)  # no refusal: one step is left
