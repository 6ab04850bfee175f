"""Resume refuses a checkpoint whose saved weights hold a NaN or an inf (`check_checkpoint_fits`,
which the Trainer runs before loading them), naming the tensor and the earlier step that
verifies: they loaded, and every step after was skipped as non-finite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ludic.errors import is_refusal
from ludic.training import CheckpointConfig, CheckpointManager, CorruptCheckpointError
from ludic.training.checkpoint import check_checkpoint_fits, read_checkpoint


def test_resuming_from_nan_weights_is_refused_naming_the_tensor_and_the_earlier_step(
    tmp_path: Path,
) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt"), keep_last=None))
    model = torch.nn.Linear(4, 4)
    good = manager.save(step=1, model=model)
    check_checkpoint_fits(model, read_checkpoint(good).model_state, good)  # finite: fits
    with torch.no_grad():
        model.bias[2] = float("nan")
    poisoned = manager.save(step=2, model=model)
    with pytest.raises(CorruptCheckpointError) as e:
        check_checkpoint_fits(model, read_checkpoint(poisoned).model_state, poisoned)
    message = str(e.value)
    assert is_refusal(e.value), message
    assert f"{poisoned}: the saved weights hold NaN or inf values (bias; 1 tensor(s))" in message
    assert f"resume from the earlier step {good}" in message, message
