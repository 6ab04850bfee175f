"""A resumed run keeps its own optimizer implementation (`TrainerConfig(fused_adamw=True)`):
loading an AdamW state dict restores the saved run's `fused`/`foreach` flags, which silently
turned fused AdamW off when the checkpoint came from a run without it (found in review)."""

from __future__ import annotations

from pathlib import Path

import torch
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo
from ludic.training.lr_resume import optimizer_kernels, restore_optimizer_kernels


def trainer(tmp_path: Path, **options: object) -> Trainer:
    config = TrainerConfig(
        lr=1e-3,
        checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=1),
        **options,  # type: ignore[arg-type]
    )
    return Trainer(tiny_llama(seed=0), make_grpo(), ListSource([mixed_items(3, seed=1)]), config)


def test_resuming_with_fused_adamw_stays_fused_and_without_stays_unfused(tmp_path: Path) -> None:
    trainer(tmp_path).run(1, progress=False)  # saved by a run without fused AdamW

    fused = trainer(tmp_path, fused_adamw=True)
    fused.resume()
    assert fused.step == 1
    assert [g["fused"] for g in fused.optimizer.param_groups] == [True]
    assert fused.optimizer.state  # the saved moments did load
    fused.run(1, progress=False)  # and a fused step runs on them

    plain = trainer(tmp_path)  # the fused run's checkpoint, resumed without the option
    plain.resume()
    assert plain.step == 2
    assert [g["fused"] for g in plain.optimizer.param_groups] == [None]


def test_restored_kernels_find_their_step_where_they_read_it() -> None:
    """Torch places a loaded `step` by the saved groups: a fused run resuming a non-fused
    checkpoint got CPU (and possibly float64) steps, which CUDA's fused AdamW refuses (found in
    review; the device half runs in tests/training/test_trainer_cuda.py)."""
    model = tiny_llama(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    kernels = optimizer_kernels(optimizer)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for param in model.parameters():
        plain.state[param] = {"step": torch.tensor(3.0, dtype=torch.float64)}
    optimizer.load_state_dict(plain.state_dict())  # a non-fused run's state, as a resume loads it
    restore_optimizer_kernels(optimizer, kernels)
    assert [g["fused"] for g in optimizer.param_groups] == [True]
    for param in model.parameters():
        step = optimizer.state[param]["step"]
        assert (step.dtype, step.device, step.item()) == (torch.float32, param.device, 3.0)
