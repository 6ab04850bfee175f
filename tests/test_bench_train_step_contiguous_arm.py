"""bench/train_step.py --arms has a `contiguous` arm: the README's training-time check of
`TrainerConfig.contiguous_parameters` ("bench/train_step.py's paired arms, separate against laid
out") compares it with `base`, whose Trainer has no publisher and so keeps load_model's separate
allocations. The arm's Trainer must hold its parameters in one storage; base's must not."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def train_step(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # as `python bench/train_step.py` runs it
    for name in ("train_step", "rl_step"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("train_step")


def _storages(module: ModuleType, name: str, model_dir: str) -> int:
    trainer = module.arm_trainer(name, model_dir, batch=None)
    return len({p.untyped_storage().data_ptr() for p in trainer.model.parameters()})


def test_contiguous_arm_lays_parameters_out_and_base_does_not(
    train_step: ModuleType, tmp_path: Path
) -> None:
    from rl_step import save_model_dir

    model_dir = save_model_dir("tiny", str(tmp_path / "model"))
    assert "contiguous" in train_step.TRAINING_ARMS
    assert _storages(train_step, "contiguous", model_dir) == 1
    assert _storages(train_step, "base", model_dir) > 1
