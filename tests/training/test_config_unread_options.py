"""A `TrainerConfig` knob its schedule never reads is named, not refused and not silent: a
min_lr_ratio with lr_schedule='constant' (an LR-schedule ablation passes it to every arm)."""

from __future__ import annotations

import warnings

import pytest

from ludic.training import TrainerConfig, UnreadOptionWarning


def test_a_floor_under_a_constant_schedule_warns_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        arms = [
            TrainerConfig(lr_schedule=schedule, total_steps=10, min_lr_ratio=0.1)
            for schedule in ("constant", "constant", "cosine", "linear")
        ]
    assert [str(w.message) for w in caught if issubclass(w.category, UnreadOptionWarning)] == [
        "TrainerConfig: min_lr_ratio=0.1 is ignored: lr_schedule='constant' never decays (the "
        "floor is read by 'cosine' and 'linear')"
    ]
    assert [arm.min_lr_ratio for arm in arms] == [0.1] * 4


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_the_default_floor_draws_no_warning(schedule: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadOptionWarning)
        TrainerConfig(lr_schedule=schedule, total_steps=10)  # type: ignore[arg-type]


def test_shared_prefix_in_batch_invariant_mode_is_named() -> None:
    with pytest.warns(UnreadOptionWarning) as caught:
        TrainerConfig(batch_invariant=True, shared_prefix=True)
    assert str(caught[0].message) == (
        "TrainerConfig: shared_prefix=True is ignored: batch_invariant=True computes every row "
        "whole (its forward takes no KV cache)"
    )
