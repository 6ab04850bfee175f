"""`restore_into` refuses an optimizer.pt that does not fit the optimizer (from another model, or
edited after the save with the manifest rewritten), naming the file and the first moment of
another shape: torch's `load_state_dict` checks only the group sizes, and the resumed run failed
at its first step ('The size of tensor a (3) must match ...')."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ludic.training.checkpoint import CheckpointConfig, CheckpointManager
from ludic.training.checkpoint_contents import restore_into
from ludic.training.checkpoint_faults import CheckpointModelMismatchError
from ludic.training.checkpoint_manifest import MANIFEST, write_manifest


def _trained() -> tuple[torch.nn.Linear, torch.optim.Adam]:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_moment_of_another_shape_is_refused_before_any_step(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    model, optimizer = _trained()
    path = manager.save(step=1, model=model, optimizer=optimizer)
    saved = torch.load(path / "optimizer.pt")
    saved["state"][0]["exp_avg"] = torch.zeros(3, 3)
    torch.save(saved, path / "optimizer.pt")
    (path / MANIFEST).unlink()
    write_manifest(path, 1)

    fresh, fresh_optimizer = _trained()
    with pytest.raises(CheckpointModelMismatchError) as e:
        restore_into(manager.load(path), model=fresh, optimizer=fresh_optimizer)
    message = str(e.value)
    assert f"{path / 'optimizer.pt'} does not fit this model's optimizer" in message, message
    assert "exp_avg of parameter 0 is [3, 3], the parameter [2, 2]" in message, message


def test_a_fitting_optimizer_state_restores(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path)))
    model, optimizer = _trained()
    path = manager.save(step=1, model=model, optimizer=optimizer)
    fresh, fresh_optimizer = _trained()
    restore_into(manager.load(path), model=fresh, optimizer=fresh_optimizer)
    moment = fresh_optimizer.state[fresh.weight]["exp_avg"]
    assert torch.equal(moment, optimizer.state[model.weight]["exp_avg"])
