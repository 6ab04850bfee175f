"""`ludic train --resume` closes its trainer (the metrics log file, the runtime) whatever
the resume raises, not only for the errors it rewords: a checkpoint of another model leaves
no open file behind (fails if `_resume` lets such an error past `trainer.close()`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ludic.models import load_model, tiny_model_dir
from ludic.recipes.configs import RESUME_LATEST, TrainConfig
from ludic.recipes.train import _resume
from ludic.recipes.training import make_trainer
from ludic.training import make_grpo
from ludic.training.checkpoint import CheckpointModelMismatchError


class NoBatches:
    async def next_batch(self) -> Any:
        raise AssertionError("the test never trains")


def _trainer(out: Path) -> Any:
    model, tokenizer = load_model(tiny_model_dir(), dtype="float32")
    return make_trainer(model, tokenizer, make_grpo(), NoBatches(), out=out, lr=1e-3)


@pytest.mark.parametrize(
    "error",
    [
        CheckpointModelMismatchError("step_00000002 does not fit the model"),
        RuntimeError("a weight push failed"),
        KeyboardInterrupt(),
    ],
    ids=["model-mismatch", "runtime-error", "interrupt"],
)
def test_a_resume_that_raises_closes_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    trainer = _trainer(tmp_path / "run")
    log_file = trainer.logger._file
    assert not log_file.closed
    closed: list[bool] = []
    close = trainer.close
    monkeypatch.setattr(trainer, "close", lambda: (closed.append(True), close())[-1])

    def fail(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(trainer, "resume", fail)
    cfg = TrainConfig(out_dir=tmp_path / "run", resume=RESUME_LATEST)
    with pytest.raises(type(error)) as raised:
        _resume(trainer, cfg, Console(quiet=True))
    assert raised.value is error  # re-raised as is, not reworded
    assert closed == [True]  # closed once
    assert log_file.closed  # the metrics log is released


def test_a_missing_checkpoint_closes_the_trainer_once(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "run")
    log_file = trainer.logger._file
    cfg = TrainConfig(out_dir=tmp_path / "run", resume=RESUME_LATEST)
    with pytest.raises(FileNotFoundError, match="run without --resume"):
        _resume(trainer, cfg, Console(quiet=True))
    assert log_file.closed
