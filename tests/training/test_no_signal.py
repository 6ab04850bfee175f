"""A run whose steps train but change no weight (every advantage 0: each group's episodes got
the same reward) says so, naming the cause, instead of looping on zero-gradient steps in
silence: after 3 such steps in a row, then every 25 of the streak; a step that learns resets
it. Every entry point gets it (the Trainer logs it): `ludic train`, the learner, the API."""

from __future__ import annotations

import logging

import pytest
from training_fakes import ListSource, item, tiny_llama

from ludic.training import Trainer, TrainerConfig, make_grpo
from ludic.training.stall import NoSignalWatch


def test_zero_advantage_steps_are_warned_about_once_the_streak_is_three(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flat = [item(6, weight=0.0, seed=s) for s in range(4)]  # advantage 0 everywhere
    learns = [item(6, weight=1.0, seed=s) for s in range(4)]
    batches = [flat, flat, flat, flat, learns, flat]
    trainer = Trainer(tiny_llama(seed=0), make_grpo(), ListSource(batches), TrainerConfig(lr=1e-3))
    with caplog.at_level(logging.WARNING, logger="ludic.training.trainer"):
        history = trainer.run(6, progress=False)
    assert [m["grad_norm"] == 0.0 for m in history] == [True] * 4 + [False, True]
    warnings = [r.getMessage() for r in caplog.records if "changed no weight" in r.getMessage()]
    assert len(warnings) == 1  # at step 3; not again at 4, nor at 6 (the streak restarted)
    assert warnings[0].startswith("steps 1..3 changed no weight: every sample's advantage is 0")
    assert "--group-size" in warnings[0]  # the CLI's flags, and what the Python API calls them
    assert (
        "GRPORequestStrategy.group_size" in warnings[0]
        and "SamplingConfig.temperature" in warnings[0]
    )


def test_the_watch_repeats_every_25_steps_of_a_streak() -> None:
    watch = NoSignalWatch()
    flat = {"num_samples": 8.0, "grad_norm": 0.0, "reward_mean": -1.0}
    said = [step for step in range(1, 60) if watch.record(step, flat)]
    assert said == [3, 28, 53]
    assert watch.record(60, {**flat, "skipped_empty": 1.0}) is None  # a skipped step: stall.py
    assert watch.streak == 0


def test_a_rollout_correction_that_rejected_every_token_is_named_not_the_advantages() -> None:
    watch = NoSignalWatch()
    rejected = {"num_samples": 8.0, "grad_norm": 0.0, "loss/rollout_is/weight_mean": 0.0}
    said = [watch.record(step, rejected) for step in range(1, 4)]
    assert said[:2] == [None, None] and said[2] is not None
    assert "the rollout correction gave every action token weight 0" in said[2]
    assert "advantage is 0" not in said[2] and "RejectOutside" in said[2]
