"""Learning-rate schedules as pure functions of the step: linear warmup, then constant, cosine
or linear decay to `min_lr_ratio` of the base rate. No optimizer logic beyond wrapping the
multiplier in a `LambdaLR`.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

LRSchedule = Literal["constant", "cosine", "linear"]
LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)


def lr_multiplier(
    step: int,
    *,
    schedule: LRSchedule = "constant",
    warmup_steps: int = 0,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """Multiplier of the base LR for optimizer update number `step` (0-based).

    warmup (step < W): (step + 1) / W
    constant:          1
    cosine:            r + (1 - r) * (1 + cos(pi * p)) / 2,  p = (step - W) / (S - W) in [0, 1]
    linear:            r + (1 - r) * (1 - p)
    with r = min_lr_ratio and S = total_steps; past S the rate stays at r.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"the {schedule!r} LR schedule needs total_steps")
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        decay = 1.0 - progress
    else:
        raise ValueError(f"unknown LR schedule {schedule!r}; expected one of {LR_SCHEDULES}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    schedule: LRSchedule = "constant",
    warmup_steps: int = 0,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` applying `lr_multiplier`; step it once per applied optimizer update."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown LR schedule {schedule!r}; expected one of {LR_SCHEDULES}")
    if schedule != "constant" and total_steps is None:
        raise ValueError(
            f"lr_schedule={schedule!r} decays over total_steps, which is not set; set "
            "TrainerConfig.total_steps or use lr_schedule='constant'"
        )

    def multiplier(step: int) -> float:
        return lr_multiplier(
            step,
            schedule=schedule,
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            min_lr_ratio=min_lr_ratio,
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
