"""CodeTestEnv refuses a compile_penalty that would reward code that does not compile."""

from __future__ import annotations

import asyncio
import math

import pytest

from ludic.envs import CodeTestEnv
from ludic.envs.code_env import CodeProblem, CodeTest


def one_problem() -> list[CodeProblem]:
    return [CodeProblem(id="p", prompt="echo", tests=(CodeTest(input="1\n", output="1\n"),))]


@pytest.mark.parametrize("penalty", [-0.5, math.inf, math.nan])
def test_a_negative_or_non_finite_penalty_is_refused(penalty: object) -> None:
    with pytest.raises(ValueError, match="compile_penalty must be a finite number >= 0"):
        CodeTestEnv(one_problem(), compile_penalty=penalty)  # type: ignore[arg-type]


def test_a_quoted_penalty_is_a_type_error_naming_the_fix() -> None:
    with pytest.raises(
        TypeError, match=r"compile_penalty must be float .*pass compile_penalty=0.5"
    ):
        CodeTestEnv(one_problem(), compile_penalty="0.5")  # type: ignore[arg-type]


def test_the_penalty_is_subtracted_for_code_that_does_not_compile() -> None:
    env = CodeTestEnv(one_problem(), compile_penalty=0.5)
    env.env_reset(seed=0)
    outcome = asyncio.run(env.env_step("```python\ndef (\n```"))
    assert outcome.reward == -0.5 and outcome.info["compiled"] is False
