"""LR multipliers derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training import TrainerConfig, UnreadOptionWarning, build_scheduler, lr_multiplier


def test_warmup_then_constant() -> None:
    values = [lr_multiplier(s, warmup_steps=4) for s in range(6)]
    assert values == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_cosine_and_linear_decay() -> None:
    # W = 2, S = 6: progress p = (step - 2) / 4; cosine = (1 + cos(pi p)) / 2; r = 0.1.
    kw = {"warmup_steps": 2, "total_steps": 6, "min_lr_ratio": 0.1}
    cosine = [lr_multiplier(s, schedule="cosine", **kw) for s in (2, 4, 6, 9)]
    expected = [0.1 + 0.9 * (1 + math.cos(math.pi * p)) / 2 for p in (0.0, 0.5, 1.0, 1.0)]
    assert cosine == pytest.approx(expected)
    linear = [lr_multiplier(s, schedule="linear", **kw) for s in (2, 3, 6)]
    assert linear == pytest.approx([1.0, 0.1 + 0.9 * 0.75, 0.1])


def test_decay_without_total_steps_is_refused() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="total_steps"):
        build_scheduler(opt, schedule="cosine")


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
@pytest.mark.parametrize("warmup", [8, 10])
def test_decay_that_starts_at_or_after_its_end_is_refused(schedule: str, warmup: int) -> None:
    # warmup 10, total 8: the LR warms up for the whole run and the decay never happens; warmup
    # 8, total 8: it reaches the full lr at update 8 and the floor at update 9, a cliff.
    with pytest.raises(ValueError, match=rf"warmup_steps={warmup} until total_steps=8"):
        TrainerConfig(lr_schedule=schedule, warmup_steps=warmup, total_steps=8)  # type: ignore[arg-type]


def test_constant_schedule_ignores_total_steps_for_its_warmup() -> None:
    with pytest.warns(UnreadOptionWarning, match="total_steps=8 is ignored"):
        config = TrainerConfig(lr_schedule="constant", warmup_steps=10, total_steps=8)
    assert config.warmup_steps == 10
