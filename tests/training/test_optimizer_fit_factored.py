"""`check_optimizer_state_fits` accepts the state of an optimizer whose moments are not shaped
like their parameters (Adafactor's factored rows and columns): it compared every state tensor
with its parameter's shape, so resuming a run with such an optimizer was refused as another
model's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ludic.training.checkpoint_faults import (
    CheckpointModelMismatchError,
    check_optimizer_state_fits,
)


def test_a_factored_optimizer_state_fits_its_own_optimizer() -> None:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    check_optimizer_state_fits(optimizer, optimizer.state_dict(), Path("ckpt/step_00000001"))


def test_adam_moments_of_another_shape_are_still_refused() -> None:
    small, large = torch.nn.Linear(4, 3), torch.nn.Linear(4, 5)
    optimizer = torch.optim.AdamW(large.parameters())
    large(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    other = torch.optim.AdamW(small.parameters())
    with pytest.raises(CheckpointModelMismatchError, match="exp_avg"):
        check_optimizer_state_fits(other, optimizer.state_dict(), Path("ckpt/step_00000001"))
