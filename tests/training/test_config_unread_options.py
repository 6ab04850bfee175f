"""A `TrainerConfig` knob its schedule never reads is named, not refused and not silent: a
min_lr_ratio or total_steps with lr_schedule='constant' (an LR-schedule ablation passes them to
every arm); `make_trainer` without a decay length draws none."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from ludic.models import load_tiny_model
from ludic.recipes.training import make_trainer
from ludic.training import SAWBatch, TrainerConfig, UnreadOptionWarning
from ludic.training.algorithm import make_sft


class NoBatches:
    async def next_batch(self) -> SAWBatch:
        raise AssertionError("not drawn")


def test_a_floor_under_a_constant_schedule_warns_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        arms = [
            TrainerConfig(lr_schedule=schedule, total_steps=10, min_lr_ratio=0.1)
            for schedule in ("constant", "constant", "cosine", "linear")
        ]
    assert [str(w.message) for w in caught if issubclass(w.category, UnreadOptionWarning)] == [
        "TrainerConfig: total_steps=10 is ignored: lr_schedule='constant' never decays "
        "(total_steps is the length of a 'cosine' or 'linear' decay)",
        "TrainerConfig: min_lr_ratio=0.1 is ignored: lr_schedule='constant' never decays (the "
        "floor is read by 'cosine' and 'linear')",
    ]
    assert [arm.min_lr_ratio for arm in arms] == [0.1] * 4


def test_the_defaults_draw_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadOptionWarning)
        TrainerConfig(lr_schedule="constant")
        TrainerConfig(lr_schedule="cosine", total_steps=10)


def test_a_decay_length_under_a_constant_schedule_is_named() -> None:
    with pytest.warns(UnreadOptionWarning) as caught:
        config = TrainerConfig(lr_schedule="constant", total_steps=10)
    assert [str(w.message) for w in caught] == [
        "TrainerConfig: total_steps=10 is ignored: lr_schedule='constant' never decays "
        "(total_steps is the length of a 'cosine' or 'linear' decay)"
    ]
    assert config.total_steps == 10


def test_make_trainer_with_its_default_schedule_draws_no_warning(tmp_path: Path) -> None:
    model, tokenizer = load_tiny_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadOptionWarning)
        trainer = make_trainer(model, tokenizer, make_sft(), NoBatches(), out=tmp_path, lr=1e-3)
    trainer.close()


def test_shared_prefix_in_batch_invariant_mode_is_named() -> None:
    with pytest.warns(UnreadOptionWarning) as caught:
        TrainerConfig(batch_invariant=True, shared_prefix=True)
    assert str(caught[0].message) == (
        "TrainerConfig: shared_prefix=True is ignored: batch_invariant=True computes every row "
        "whole (its forward takes no KV cache)"
    )
