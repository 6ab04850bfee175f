"""Resuming past a corrupt checkpoint renames it `step_N.corrupt`, so retention never counts it
and never deletes the good checkpoint the run resumed from (fails if the corrupt one is counted).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from ludic.cli import main as ludic_main
from ludic.training.checkpoint import (
    CheckpointConfig,
    CheckpointManager,
    complete_checkpoints,
)

FLAGS = ["--problems-per-step", "1", "--group-size", "2", "--max-tokens", "6", "--max-steps", "2"]
FLAGS += ["--checkpoint-every", "2", "--no-progress"]


def _train(out: Path, steps: int, *extra: str) -> None:
    ludic_main(["train", "--out-dir", str(out), "--steps", str(steps), *FLAGS, *extra])


@pytest.mark.slow
def test_ludic_train_resume_past_a_corrupt_checkpoint_keeps_the_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    root = out / "checkpoints"
    _train(out, 3)  # saves step 2 (every 2) and the final step 3; keeps the last 2
    assert [p.name for p in complete_checkpoints(root)] == ["step_00000002", "step_00000003"]
    weights = root / "step_00000003" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated: the manifest's size differs
    with caplog.at_level(logging.WARNING, logger="ludic.training.checkpoint"):
        _train(out, 4, "--resume")
    names = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    assert names == ["step_00000002", "step_00000003.corrupt", "step_00000004"]
    manager = CheckpointManager(CheckpointConfig(dir=str(root)))
    for good in ("step_00000002", "step_00000004"):
        manager.verify(root / good)  # the checkpoint resumed from survived retention
    assert any("renamed corrupt checkpoint" in r.message for r in caplog.records)
    assert manager.latest() == root / "step_00000004"


def test_retention_after_quarantine_counts_only_good_checkpoints(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), keep_last=2))
    for step in (1, 2):
        manager.save(step=step, model=model)
    (tmp_path / "step_00000002" / "state.json").write_text("{}")  # size differs: corrupt
    assert manager.resolve() == tmp_path / "step_00000001"
    assert (tmp_path / "step_00000002.corrupt").is_dir()
    manager.save(step=2, model=model)  # the resumed run saves step 2 again
    manager.save(step=3, model=model)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]
    assert (tmp_path / "step_00000002.corrupt").is_dir()  # kept for inspection
