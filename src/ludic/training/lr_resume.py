"""The learning-rate settings a checkpoint records, and what resume does when they changed.

A `LambdaLR`'s state holds its base rates and position but not its multiplier, so a resumed
Trainer would silently keep the checkpoint's `lr` and follow the new config's decay (a larger
`total_steps` stretches a finished cosine back up). `Trainer.save_checkpoint` records these
settings; `Trainer.resume` compares them with its config and refuses a change
(`LRScheduleMismatchError`) unless told to apply the new ones (`apply_lr_settings`). It does
not decide what a change means for a run; the caller (e.g. `ludic train`) names its flags.
"""

from __future__ import annotations

from typing import Any

import torch

from ludic.training.config import TrainerConfig

RECORD_KEY = "lr_settings"
"""Key of the settings in a checkpoint's `extra` (state.json)."""


class LRScheduleMismatchError(ValueError):
    """The config's LR settings differ from the checkpoint's: `changes` maps each
    `TrainerConfig` field to (checkpoint's value, config's value)."""

    def __init__(
        self, checkpoint: str, changes: dict[str, tuple[Any, Any]], step: int | None = None
    ) -> None:
        self.changes = changes
        self.step = step  # the checkpoint's step: a caller may have a plainer refusal for it
        listed = ", ".join(
            f"{k}: checkpoint {old!r}, config {new!r}" for k, (old, new) in changes.items()
        )
        super().__init__(
            f"{checkpoint} was trained with other LR settings ({listed}); resume with the "
            "checkpoint's values, or pass override_lr_schedule=True to apply the config's"
        )


def lr_settings(config: TrainerConfig) -> dict[str, Any]:
    """What decides each step's LR. A constant schedule ignores total_steps and
    min_lr_ratio, so they are None there (changing them changes nothing)."""
    decays = config.lr_schedule != "constant"
    return {
        "lr": config.lr,
        "lr_schedule": config.lr_schedule,
        "warmup_steps": config.warmup_steps,
        "total_steps": config.total_steps if decays else None,
        "min_lr_ratio": config.min_lr_ratio if decays else None,
    }


def lr_changes(
    recorded: dict[str, Any] | None, config: TrainerConfig
) -> dict[str, tuple[Any, Any]]:
    """The settings that differ between a checkpoint's record and `config` (none when the
    checkpoint predates the record)."""
    if not recorded:
        return {}
    now = lr_settings(config)
    return {k: (recorded.get(k), v) for k, v in now.items() if recorded.get(k) != v}


def apply_lr_settings(
    scheduler: torch.optim.lr_scheduler.LambdaLR, optimizer: torch.optim.Optimizer, lr: float
) -> None:
    """After loading a checkpoint's scheduler and optimizer states: rebase them on `lr` and the
    scheduler's own multiplier (the config's), keeping the position, so the next update uses
    lr x multiplier(position)."""
    position = scheduler.last_epoch
    scheduler.base_lrs = [lr for _ in optimizer.param_groups]
    rates: list[Any] = [lr * fn(position) for fn in scheduler.lr_lambdas]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["initial_lr"] = lr
        group["lr"] = rate
    scheduler._last_lr = rates  # what get_last_lr() returns


KERNEL_KEYS = ("fused", "foreach", "capturable", "differentiable")
"""Optimizer param-group keys that pick an implementation, not a state: a resumed run keeps
its own (`TrainerConfig(fused_adamw=True)` resuming a run saved without it stays fused)."""


def optimizer_kernels(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's `KERNEL_KEYS` settings, to put back after loading a state dict."""
    return [{k: g[k] for k in KERNEL_KEYS if k in g} for g in optimizer.param_groups]


def restore_optimizer_kernels(
    optimizer: torch.optim.Optimizer, kernels: list[dict[str, Any]]
) -> None:
    """After loading a state dict: put this run's `kernels` (`optimizer_kernels`, taken before
    the load) back, and each parameter's `step` where that kernel reads it. Torch places a
    loaded `step` by the *saved* groups (on the parameter's device, float32, only for fused or
    capturable ones; else where it was saved), so a fused run resuming a non-fused checkpoint
    would hand CUDA's fused AdamW CPU step tensors ("Expected all tensors to be on the same
    device"), and the reverse would leave a plain kernel device steps."""
    for group, choices in zip(optimizer.param_groups, kernels, strict=True):
        group.update(choices)
        on_device = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            state = optimizer.state.get(param)
            step = None if state is None else state.get("step")
            if state is not None and isinstance(step, torch.Tensor):
                state["step"] = (
                    step.to(dtype=torch.float32, device=param.device) if on_device else step.cpu()
                )
