"""A save whose `step_N` name is taken by a file or a symlink (a broken one, or a loop) in the
checkpoint root writes the checkpoint in its place: renaming the new directory onto a symlink
failed with 'Not a directory' after the steps had trained, and a file moved aside was left
behind as `.old-step_N-*`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ludic.training.checkpoint import CheckpointConfig, CheckpointManager, complete_checkpoints


def _loop(path: Path) -> None:
    os.symlink(path.name, path)


def _dangling(path: Path) -> None:
    os.symlink(path.parent / "gone", path)


def _file(path: Path) -> None:
    path.write_text("not a checkpoint")


@pytest.mark.parametrize("take", [_loop, _dangling, _file], ids=["loop", "dangling", "file"])
def test_a_save_replaces_what_holds_its_name(tmp_path: Path, take: Callable[[Path], None]) -> None:
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=None))
    take(manager.path_for(2))
    saved = manager.save(step=2, model=torch.nn.Linear(2, 2))
    assert saved.is_dir() and not saved.is_symlink()
    assert complete_checkpoints(tmp_path) == [saved]
    assert manager.resolve() == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == [saved.name]  # nothing left aside
