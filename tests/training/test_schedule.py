"""LR multipliers derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training import build_scheduler, lr_multiplier


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
