"""What a parser returns leaves it into the env (the action) and the rollout record (all three
fields): a numpy reward becomes a float, and an action or feedback that is not text, or a
reward that is not a finite number, is the parser's bug, counted as a parse failure naming
the parser, the field and the type (as a parser that raises or returns no ParseResult is).
A numpy reward or action used to fail only at the rollout log write, after the env had
received an int as its action."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import check_parse_result
from ludic.types import Info, ParseResult, Rollout, StepOutcome


class RecordingEnv(SingleAgentEnv):
    def __init__(self) -> None:
        self.actions: list[object] = []

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "answer", {}

    def env_step(self, action: str) -> StepOutcome:
        self.actions.append(action)
        return StepOutcome(obs="", reward=1.0, terminated=True)


def parse_always(result: ParseResult) -> object:
    def fixed_parser(text: str) -> ParseResult:
        return result

    return fixed_parser


async def run_with(result: ParseResult) -> tuple[Rollout, RecordingEnv]:
    env = RecordingEnv()
    agent = Agent(ScriptedClient(["anything"]), parser=parse_always(result))  # type: ignore[arg-type]
    (rollout,) = await SingleAgentProtocol(agent, max_steps=1).run(env, env_seed=0)
    json.dumps(rollout.to_dict())  # the record can be written
    return rollout, env


@pytest.mark.parametrize("reward", [np.float32(0.5), np.float64(0.5), 0.5, True])
async def test_a_numpy_or_int_reward_becomes_a_float(reward: object) -> None:
    rollout, env = await run_with(ParseResult(action="a", reward=reward))  # type: ignore[arg-type]
    (step,) = rollout.agent_steps
    assert env.actions == ["a"]
    assert type(step.parse_result.reward) is float and type(step.reward) is float  # type: ignore[union-attr]
    assert step.reward == float(reward)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "named"),
    [
        (ParseResult(action=np.int64(3)), "ParseResult.action = np.int64(3) (a numpy.int64)"),  # type: ignore[arg-type]
        (ParseResult(action=3), "ParseResult.action = 3 (an int); action must be a str"),  # type: ignore[arg-type]
        (
            ParseResult(action=None, reward=-1.0, obs=np.array([1])),  # type: ignore[arg-type]
            "ParseResult.obs = array([1]) (a numpy.ndarray); obs must be a str",
        ),
        (ParseResult(action="a", reward="1"), "ParseResult.reward = '1' (a str)"),  # type: ignore[arg-type]
        (ParseResult(action="a", reward=math.nan), "ParseResult.reward = nan; the reward must"),
    ],
)
async def test_a_field_the_record_cannot_hold_is_a_named_parse_failure(
    result: ParseResult, named: str
) -> None:
    rollout, env = await run_with(result)
    (step,) = rollout.agent_steps
    assert env.actions == []  # the env never received it
    assert step.info["parse_error"] is True
    assert f"fixed_parser returned {named}" in step.info["parser_exception"]


def test_a_plain_result_is_returned_as_is() -> None:
    result = ParseResult(action="a", reward=1.0, obs=None)
    assert check_parse_result(result, where="p") is result
