"""`Trainer.resume` of a checkpoint another algorithm trained (a GiGPO run resumed as GRPO from
Python, or `examples/custom_env/train.py --resume --algorithm grpo`) went on silently under the
other loss, into the same logs; `ludic train` refuses it from its run record. The checkpoint now
records the algorithm's name, and such a resume warns, naming both and what to do."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, ConstantCredit, RLAlgorithm, Trainer, TrainerConfig


def _trainer(tmp_path: Path, name: str) -> Trainer:
    algorithm = RLAlgorithm(
        name=name, credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL()
    )
    config = replace(TrainerConfig(lr=5e-3), checkpoint=CheckpointConfig(dir=str(tmp_path)))
    batches = [mixed_items(4, seed=s) for s in range(4)]
    return Trainer(tiny_llama(seed=0), algorithm, ListSource(batches), config)


def test_resuming_under_another_algorithm_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _trainer(tmp_path, "gigpo")
    first.run(1, progress=False)
    first.save_checkpoint()
    with caplog.at_level(logging.WARNING, logger="ludic.training.trainer_checkpoints"):
        assert _trainer(tmp_path, "grpo").resume() == 1
    warned = [r.getMessage() for r in caplog.records if "trained with algorithm" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert "'gigpo'" in warned[0] and "under algorithm 'grpo'" in warned[0], warned[0]
    assert "resume with 'gigpo'" in warned[0], warned[0]


def test_resuming_under_the_same_algorithm_is_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _trainer(tmp_path, "grpo")
    first.run(1, progress=False)
    first.save_checkpoint()
    with caplog.at_level(logging.WARNING, logger="ludic.training.trainer_checkpoints"):
        assert _trainer(tmp_path, "grpo").resume() == 1
    assert "trained with algorithm" not in caplog.text
