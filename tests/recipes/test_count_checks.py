"""`check_count_flags` knows no flag names: `--micro-batch-tokens`, a token budget rather than a
count of things to train on, got its own words through a special case on its name inside it
(the hint `ludic learner` passed with it went unused). It has its own check now,
`check_micro_batch_tokens`, which the learner calls; the words are the same."""

from __future__ import annotations

import pytest

from ludic.recipes.configs import DEFAULT_MICRO_BATCH_TOKENS
from ludic.recipes.count_checks import check_count_flags, check_micro_batch_tokens


def test_a_count_is_refused_in_the_shared_words_whatever_its_flag() -> None:
    with pytest.raises(ValueError) as refused:
        check_count_flags(("--micro-batch-tokens", 0, "the hint given"))
    assert str(refused.value) == (
        "--micro-batch-tokens is 0, so nothing would train: pass --micro-batch-tokens >= 1 "
        "(the hint given)"
    )


@pytest.mark.parametrize("value", [0, -5])
def test_a_micro_batch_of_no_tokens_is_refused_as_a_budget(value: int) -> None:
    with pytest.raises(ValueError) as refused:
        check_micro_batch_tokens(value)
    assert str(refused.value) == (
        f"--micro-batch-tokens is {value}: a micro-batch of {value} tokens holds no sample; give "
        f"a token budget per forward/backward >= 1, leave it out for "
        f"{DEFAULT_MICRO_BATCH_TOKENS}, or pass --micro-batch-tokens None for the whole batch "
        "in one pass"
    )


@pytest.mark.parametrize("value", [None, 1, DEFAULT_MICRO_BATCH_TOKENS])
def test_a_budget_of_one_token_or_more_or_none_is_accepted(value: int | None) -> None:
    check_micro_batch_tokens(value)
