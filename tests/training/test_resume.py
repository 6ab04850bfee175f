"""Resuming from a checkpoint reproduces the uninterrupted run exactly (deterministic CPU)."""

from __future__ import annotations

from pathlib import Path

import torch
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, ConstantCredit, RLAlgorithm, Trainer, TrainerConfig

ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())
BATCHES = [mixed_items(4, seed=s) for s in range(5)]


def _trainer(tmp_path: Path, model_seed: int) -> Trainer:
    config = TrainerConfig(
        lr=5e-3,
        weight_decay=0.1,
        lr_schedule="cosine",
        warmup_steps=2,
        total_steps=6,
        micro_batch_tokens=32,
        seed=11,
        checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=3),
    )
    # Attention dropout makes the losses depend on the torch RNG, so RNG restore matters.
    return Trainer(tiny_llama(seed=model_seed, dropout=0.2), ALGORITHM, ListSource(BATCHES), config)


def test_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    full = _trainer(tmp_path / "a", model_seed=0)
    full_losses = [m["loss"] for m in full.run(6, progress=False)]

    first = _trainer(tmp_path / "b", model_seed=0)
    first_losses = [m["loss"] for m in first.run(4, progress=False)]  # checkpoint at step 3
    assert first_losses[:3] == full_losses[:3]

    resumed = _trainer(tmp_path / "b", model_seed=123)  # different init: all state must load
    assert resumed.resume() == 3
    assert resumed.policy_version == 3 and resumed.batch_source.position == 3  # type: ignore[attr-defined]
    resumed_losses = [m["loss"] for m in resumed.run(3, progress=False)]
    assert resumed_losses == full_losses[3:]
    for (name, a), b in zip(
        full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name


def test_without_rng_restore_dropout_differs(tmp_path: Path) -> None:
    """Guards the test above: with dropout the losses really depend on the RNG."""
    seeded = _trainer(tmp_path / "a", model_seed=0).run(1, progress=False)[0]["loss"]
    again = _trainer(tmp_path / "b", model_seed=0).run(1, progress=False)[0]["loss"]
    other = _trainer(tmp_path / "c", model_seed=0)
    torch.manual_seed(999)  # same weights and data, another RNG state
    assert seeded == again != other.run(1, progress=False)[0]["loss"]
