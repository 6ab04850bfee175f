"""`Trainer.resume` with other LR settings than the checkpoint recorded: refused before
anything loads (LambdaLR would silently restore the old base rate and follow the new decay);
`override_lr_schedule=True` applies the config's rate from the checkpoint's position on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, ConstantCredit, RLAlgorithm, Trainer, TrainerConfig
from ludic.training.lr_resume import LRScheduleMismatchError
from ludic.training.schedule import lr_multiplier

ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())
CONFIG = TrainerConfig(lr=5e-3, lr_schedule="cosine", warmup_steps=1, total_steps=6)


def _trainer(tmp_path: Path, config: TrainerConfig) -> Trainer:
    config = replace(config, checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt")))
    batches = [mixed_items(4, seed=s) for s in range(6)]
    return Trainer(tiny_llama(seed=0), ALGORITHM, ListSource(batches), config)


def test_changed_lr_settings_are_refused_unless_overridden(tmp_path: Path) -> None:
    first = _trainer(tmp_path, CONFIG)
    first.run(2, progress=False)
    first.save_checkpoint()
    weights = {k: v.clone() for k, v in first.model.state_dict().items()}

    changed = _trainer(tmp_path, replace(CONFIG, lr=1e-3, total_steps=12))
    with pytest.raises(LRScheduleMismatchError, match=r"lr: checkpoint 0\.005, config 0\.001") as e:
        changed.resume()
    assert e.value.changes == {"lr": (5e-3, 1e-3), "total_steps": (6, 12)}
    assert changed.step == 0  # nothing was loaded

    assert changed.resume(override_lr_schedule=True) == 2
    assert all((changed.model.state_dict()[k] == v).all() for k, v in weights.items())
    expected = 1e-3 * lr_multiplier(2, schedule="cosine", warmup_steps=1, total_steps=12)
    assert changed.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    logged = changed.run(2, progress=False)
    assert logged[0]["lr"] == pytest.approx(expected)  # the next update uses the new rate
    assert logged[1]["lr"] == pytest.approx(
        1e-3 * lr_multiplier(3, schedule="cosine", warmup_steps=1, total_steps=12)
    )


def test_the_same_settings_resume_as_before(tmp_path: Path) -> None:
    first = _trainer(tmp_path, CONFIG)
    first.run(2, progress=False)
    first.save_checkpoint()
    again = _trainer(tmp_path, CONFIG)
    assert again.resume() == 2
    assert again.run(1, progress=False)[0]["lr"] == pytest.approx(
        5e-3 * lr_multiplier(2, schedule="cosine", warmup_steps=1, total_steps=6)
    )
