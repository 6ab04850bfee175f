"""`Trainer.resume` refuses a checkpoint whose optimizer.pt does not fit the optimizer (another
model's, or edited with the manifest rewritten) before any step, naming the file and the first
moment of another shape: the resumed run failed at its first Adam update instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ludic.models import load_tiny_model
from ludic.recipes.training import finish, make_trainer
from ludic.training import SAWBatch
from ludic.training.algorithm import make_sft
from ludic.training.checkpoint_faults import CheckpointModelMismatchError
from ludic.training.checkpoint_manifest import MANIFEST, write_manifest


class NoBatches:
    async def next_batch(self) -> SAWBatch:
        raise AssertionError("not drawn")


def test_an_optimizer_state_of_another_shape_is_refused_at_resume(tmp_path: Path) -> None:
    model, tokenizer = load_tiny_model()
    step_dir = finish(make_trainer(model, tokenizer, make_sft(), NoBatches(), out=tmp_path, lr=1))
    state = {"state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3, 3)}}}
    params = list(range(sum(1 for _ in model.parameters())))
    saved = torch.load(step_dir / "optimizer.pt")
    state["param_groups"] = [dict(saved["param_groups"][0], params=params)]
    torch.save(state, step_dir / "optimizer.pt")
    (step_dir / MANIFEST).unlink()
    write_manifest(step_dir, 0)

    trainer = make_trainer(*load_tiny_model(), make_sft(), NoBatches(), out=tmp_path, lr=1)
    with pytest.raises(CheckpointModelMismatchError) as e:
        trainer.resume()
    message = str(e.value)
    assert f"{step_dir / 'optimizer.pt'} does not fit this model's optimizer" in message, message
    assert "exp_avg of parameter 0 is [3, 3]" in message, message
