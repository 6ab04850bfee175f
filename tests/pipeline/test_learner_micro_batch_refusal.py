"""`ludic learner --micro-batch-tokens 0` was refused as "--micro-batch-tokens is 0, so nothing
would train", the wording of a count of things to train on; the flag is the token budget of one
forward/backward, so the refusal says that a micro-batch of 0 tokens holds no sample and what
leaving it out or None does."""

from __future__ import annotations

import pytest

from ludic.pipeline.commands import run_learner
from ludic.pipeline.config import LearnerConfig
from ludic.recipes.configs import DEFAULT_MICRO_BATCH_TOKENS

NO_REDIS = "redis://127.0.0.1:1/0"  # refused before Redis is touched


@pytest.mark.parametrize("value", [0, -5])
def test_the_learner_refuses_a_micro_batch_of_no_tokens_in_its_own_words(value: int) -> None:
    with pytest.raises(ValueError) as refused:
        run_learner(LearnerConfig(redis_url=NO_REDIS, micro_batch_tokens=value))
    message = str(refused.value)
    assert message.startswith(
        f"--micro-batch-tokens is {value}: a micro-batch of {value} tokens holds no sample; "
        "give a token budget per forward/backward >= 1"
    ), message
    assert f"leave it out for {DEFAULT_MICRO_BATCH_TOKENS}" in message
    assert "--micro-batch-tokens None for the whole batch in one pass" in message
    assert "nothing would train" not in message


def test_the_learners_counts_keep_the_shared_words() -> None:
    with pytest.raises(ValueError, match=r"^--steps is 0, so nothing would train: pass --steps"):
        run_learner(LearnerConfig(redis_url=NO_REDIS, steps=0, micro_batch_tokens=0))
