"""`termination_detail` counts in the noun's number: a one-step episode read '1 steps' and a
`CriticalError(max_consecutive_parse_errors=1)` end '1 parse errors in a row' (the README's
examples are '12 steps' and '2 parse errors in a row')."""

from __future__ import annotations

import asyncio

import pytest

from ludic.agents import Agent
from ludic.envs import TicTacToeEnv, env_parser
from ludic.inference import ScriptedClient
from ludic.interaction import CriticalError, MaxSteps, SingleAgentProtocol


def detail(reply: str, **protocol_kwargs: object) -> str:
    agent = Agent(ScriptedClient([reply]), parser=env_parser("tictactoe"))
    protocol = SingleAgentProtocol(agent, **protocol_kwargs)  # type: ignore[arg-type]
    (rollout,) = asyncio.run(protocol.run(TicTacToeEnv(opponent="random"), env_seed=0))
    return rollout.meta["termination_detail"]


@pytest.mark.parametrize(("steps", "expected"), [(1, "1 step"), (2, "2 steps")])
def test_max_steps_detail(steps: int, expected: str) -> None:
    assert detail("no move", max_steps=steps) == expected


@pytest.mark.parametrize(
    ("n", "expected"), [(1, "1 parse error in a row"), (2, "2 parse errors in a row")]
)
def test_parse_error_detail(n: int, expected: str) -> None:
    rules = [CriticalError(max_consecutive_parse_errors=n), MaxSteps(max_steps=9)]
    assert detail("no move", termination=rules) == expected
