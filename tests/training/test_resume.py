"""Resuming from a checkpoint reproduces the uninterrupted run exactly (deterministic CPU)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama

from ludic.distributed import PolicyPublisher
from ludic.training import (
    CheckpointConfig,
    ConstantCredit,
    CorruptCheckpointError,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
)

ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())
BATCHES = [mixed_items(4, seed=s) for s in range(5)]


def _config(tmp_path: Path) -> TrainerConfig:
    return TrainerConfig(
        lr=5e-3,
        weight_decay=0.1,
        lr_schedule="cosine",
        warmup_steps=2,
        total_steps=6,
        micro_batch_tokens=32,
        seed=11,
        checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=3),
    )


def _trainer(tmp_path: Path, model_seed: int, publisher: PolicyPublisher | None = None) -> Trainer:
    # Attention dropout makes the losses depend on the torch RNG, so RNG restore matters.
    model = tiny_llama(seed=model_seed, dropout=0.2)
    source = ListSource(BATCHES)
    return Trainer(model, ALGORITHM, source, _config(tmp_path), publisher=publisher)


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


@dataclass
class RecordingPublisher:
    published: list[tuple[int, dict[str, torch.Tensor]]] = field(default_factory=list)

    def publish(self, weights: torch.nn.Module, *, version: int) -> None:
        state = {k: v.detach().clone() for k, v in weights.state_dict().items()}
        self.published.append((version, state))


def test_resume_publishes_the_restored_weights_and_version(tmp_path: Path) -> None:
    first = _trainer(tmp_path, model_seed=0)
    first.run(3, progress=False)  # checkpoint at step 3
    saved = {k: v.clone() for k, v in first.model.state_dict().items()}

    publisher = RecordingPublisher()
    resumed = _trainer(tmp_path, model_seed=123, publisher=publisher)
    assert resumed.resume() == 3
    # Before any rollout: the restored version and weights, not the fresh init.
    assert [version for version, _ in publisher.published] == [3]
    state = publisher.published[0][1]
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    resumed.run(1, progress=False)
    assert [version for version, _ in publisher.published] == [3, 4]


def test_resume_from_the_checkpoint_root_takes_the_newest_complete_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = replace(
        _config(tmp_path),
        checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=2, keep_last=None),
    )
    first = Trainer(tiny_llama(seed=0), ALGORITHM, ListSource(BATCHES), config)
    first.run(6, progress=False)  # checkpoints at 2, 4, 6
    (tmp_path / "ckpt" / "step_00000006" / "MANIFEST.json").unlink()  # a save that never finished

    other_dir = replace(config, checkpoint=CheckpointConfig(dir=str(tmp_path / "elsewhere")))
    resumed = Trainer(tiny_llama(seed=1), ALGORITHM, ListSource(BATCHES), other_dir)
    with caplog.at_level(logging.WARNING):
        assert resumed.resume(tmp_path / "ckpt") == 4  # the root, not a step_* directory
    assert "step_00000006" in caplog.text and "partial" in caplog.text
    assert "using" in caplog.text and "step_00000004" in caplog.text
    with pytest.raises(
        CorruptCheckpointError, match=r"partial.*newest complete checkpoint is .*step_00000004"
    ):
        resumed.resume(tmp_path / "ckpt" / "step_00000006")
    with pytest.raises(FileNotFoundError, match="holds no step_"):
        resumed.resume(tmp_path)  # a directory without checkpoints


def test_missing_ok_lets_a_first_launch_run_the_resume_code(tmp_path: Path) -> None:
    publisher = RecordingPublisher()
    first = _trainer(tmp_path, model_seed=0, publisher=publisher)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        first.resume()
    assert first.resume(missing_ok=True) == 0 and publisher.published == []
    first.run(3, progress=False)  # checkpoint at step 3
    (tmp_path / "ckpt" / "step_00000003" / "MANIFEST.json").unlink()
    with pytest.raises(FileNotFoundError, match="partial"):  # broken is not missing
        _trainer(tmp_path, model_seed=0).resume(missing_ok=True)
