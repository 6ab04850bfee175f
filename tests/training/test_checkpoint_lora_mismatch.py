"""Resuming a full-parameter checkpoint into a LoRA-wrapped model (`add_lora` added to the script
between runs), or a LoRA adapter checkpoint into a plain model (`add_lora` dropped), is refused
naming what differs (LoRA) and the fix, not only the model directory the run started from (which
is the same model in both cases, so that advice alone sends the user in a circle)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_worker_common import ALGORITHM, batches_for, lora_model, trainer_config
from training_fakes import ListSource, tiny_llama

from ludic.training import Trainer
from ludic.training.checkpoint import CheckpointModelMismatchError

pytest.importorskip("peft")


def _trained(checkpoint_dir: Path, *, lora: bool) -> None:
    model = lora_model(seed=0) if lora else tiny_llama(seed=0)
    config = trainer_config(checkpoint_dir, every_n_steps=1)
    Trainer(model, ALGORITHM, ListSource(batches_for(0, 1)), config).run(1, progress=False)


def _resume_error(checkpoint_dir: Path, *, lora: bool) -> str:
    model = lora_model(seed=0) if lora else tiny_llama(seed=0)
    config = trainer_config(checkpoint_dir, every_n_steps=1)
    trainer = Trainer(model, ALGORITHM, ListSource(batches_for(0, 1)), config)
    with pytest.raises(CheckpointModelMismatchError) as e:
        trainer.resume()
    return str(e.value)


def test_full_checkpoint_into_a_lora_model_names_lora_and_the_fix(tmp_path: Path) -> None:
    _trained(tmp_path, lora=False)
    message = _resume_error(tmp_path, lora=True)
    assert "step_00000001" in message
    assert "full-parameter" in message and "LoRA" in message, message
    assert "without add_lora" in message, message


def test_lora_checkpoint_into_a_plain_model_names_lora_and_the_fix(tmp_path: Path) -> None:
    _trained(tmp_path, lora=True)
    message = _resume_error(tmp_path, lora=False)
    assert "step_00000001" in message
    assert "LoRA adapter" in message and "add_lora" in message, message
