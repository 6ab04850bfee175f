"""`ludic learner --no-resume` in an --out-dir that holds an earlier run's checkpoints is
refused before Redis or the model, as `ludic train` refuses it: the new run would overwrite the
earlier run's checkpoint of the same step, leave its newer ones beside it (the next resume would
pick those) and replace its metrics.jsonl."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ludic.pipeline.commands import run_learner
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.learner_settings import LEARNER_SETTINGS_KEY, learner_settings
from ludic.training.checkpoint import STATE
from ludic.training.checkpoint_manifest import MANIFEST

# nothing listens on port 1: were the out-dir not refused first, Redis would be the error
UNREACHABLE = "redis://127.0.0.1:1/0"


def _checkpoint(out_dir: Path, cfg: LearnerConfig, step: int) -> None:
    path = out_dir / "checkpoints" / f"step_{step:08d}"
    path.mkdir(parents=True)
    (path / MANIFEST).write_text("{}")
    extra = {LEARNER_SETTINGS_KEY: learner_settings(cfg)}
    (path / STATE).write_text(json.dumps({"step": step, "extra": extra}))


def test_a_fresh_run_over_an_earlier_runs_checkpoints_is_refused(tmp_path: Path) -> None:
    cfg = LearnerConfig(out_dir=tmp_path / "run", redis_url=UNREACHABLE, resume=False)
    _checkpoint(cfg.out_dir, cfg, 2)
    _checkpoint(cfg.out_dir, cfg, 3)
    with pytest.raises(FileExistsError) as refused:
        run_learner(cfg)
    text = str(refused.value)
    assert f"{cfg.out_dir} holds an earlier run's checkpoints (newest: step_00000003)" in text
    assert "Drop --no-resume to continue that run, or pass another --out-dir" in text


def test_a_fresh_run_without_checkpoints_goes_on_to_redis(tmp_path: Path) -> None:
    """Only checkpoints are refused: an empty out-dir, or a run that keeps none, reaches Redis
    (unreachable here, so that is the error)."""
    for cfg in (
        LearnerConfig(out_dir=tmp_path / "empty", redis_url=UNREACHABLE, resume=False),
        dataclasses.replace(
            LearnerConfig(out_dir=tmp_path / "run", redis_url=UNREACHABLE, resume=False),
            checkpoint_every=None,
        ),
    ):
        if cfg.checkpoint_every is None:
            _checkpoint(cfg.out_dir, cfg, 2)
        with pytest.raises(Exception, match="unreachable") as failed:
            run_learner(cfg)
        assert not isinstance(failed.value, FileExistsError)
