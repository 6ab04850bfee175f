"""TicTacToeDuelEnv, MemoryCorridorEnv, DatasetQAEnv and CodeTestEnv refuse a setting of the
wrong type at construction with a TypeError naming the env, the argument, the type wanted and,
for a quoted number or boolean, the fix (`MemoryCorridorEnv(length="6")` used to fail with
"'<' not supported between 'str' and 'int'"; `DatasetQAEnv(sample_index="3")` likewise)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ludic.envs.code_env import CodeProblem, CodeTest, CodeTestEnv
from ludic.envs.dataset_qa import DatasetQAEnv
from ludic.envs.long_task import MemoryCorridorEnv
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv

DATA = [{"question": "1+1?", "answer": "2"}]
ECHO = CodeProblem(id="echo", prompt="Echo the input.", tests=(CodeTest(input="a", output="a"),))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: TicTacToeDuelEnv(win_reward="1"),
            "TicTacToeDuelEnv: win_reward must be float (or int), got '1' (str); pass win_reward=1",
        ),
        (
            lambda: TicTacToeDuelEnv(x_id=0),
            "TicTacToeDuelEnv: x_id must be str, got 0 (int)",
        ),
        (
            lambda: TicTacToeDuelEnv(observation=1),
            "TicTacToeDuelEnv: observation must be one of 'full', 'compact', got 1 (int)",
        ),
        (
            lambda: MemoryCorridorEnv(length="6"),
            "MemoryCorridorEnv: length must be int, got '6' (str); pass length=6",
        ),
        (
            lambda: MemoryCorridorEnv(code_alphabet=123),
            "MemoryCorridorEnv: code_alphabet must be str, got 123 (int)",
        ),
        (
            lambda: MemoryCorridorEnv(penalty_coef="0.5"),
            "MemoryCorridorEnv: penalty_coef must be float (or int), got '0.5' (str); "
            "pass penalty_coef=0.5",
        ),
        (
            lambda: DatasetQAEnv(DATA, sample_index="0"),
            "DatasetQAEnv: sample_index must be int or None, got '0' (str); pass sample_index=0",
        ),
        (
            lambda: DatasetQAEnv(DATA, system_prompt=1),
            "DatasetQAEnv: system_prompt must be str or None, got 1 (int)",
        ),
        (
            lambda: DatasetQAEnv(DATA, parse_failure_ends_episode="false"),
            "DatasetQAEnv: parse_failure_ends_episode must be true or false or None, got 'false' "
            "(str); pass parse_failure_ends_episode=False",
        ),
        (
            lambda: CodeTestEnv([ECHO], compile_penalty="0.5"),
            "CodeTestEnv: compile_penalty must be float (or int), got '0.5' (str); "
            "pass compile_penalty=0.5",
        ),
        (
            lambda: CodeTestEnv([ECHO], scoring=1),
            "CodeTestEnv: scoring must be one of 'fraction', 'all_or_nothing', got 1 (int)",
        ),
    ],
)
def test_a_wrong_type_is_refused_at_construction(build: Callable[[], object], message: str) -> None:
    with pytest.raises(TypeError) as caught:
        build()
    assert str(caught.value) == message


def test_right_types_still_build() -> None:
    duel = TicTacToeDuelEnv(win_reward=2, observation="compact")  # an int is a float
    assert duel.rewards["win"] == 2 and duel.observation == "compact"
    corridor = MemoryCorridorEnv(length=3, penalty_coef=1)
    assert corridor.length == 3
    corridor.reset(seed=0)
    qa = DatasetQAEnv(DATA, sample_index=0, parse_failure_ends_episode=False)
    assert qa.sample_index == 0 and qa.parse_failure_ends_episode is False
    code = CodeTestEnv([ECHO], compile_penalty=1, scoring="all_or_nothing")
    assert code.compile_penalty == 1


def test_a_subclass_is_named_in_the_refusal() -> None:
    class MyQA(DatasetQAEnv):
        pass

    with pytest.raises(TypeError, match=r"^MyQA: sample_index must be int or None"):
        MyQA(DATA, sample_index=1.0)
