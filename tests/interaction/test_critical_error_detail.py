"""A CriticalError termination's `termination_detail` is a readable sentence whatever the env
put in `info["critical_error"]` (a flag, a message, an exception, a record), as the other
rules' details are ("3 steps", "2 parse errors in a row"), and the rollout meta stays JSON."""

from __future__ import annotations

import json

import pytest

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import CriticalError, SingleAgentProtocol
from ludic.types import Info, StepOutcome


class ReportsEnv(SingleAgentEnv):
    """Its first step reports `value` under `key`."""

    def __init__(self, key: str, value: object) -> None:
        self.key, self.value = key, value

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="next", reward=0.0, info={self.key: self.value})


async def detail(value: object, key: str = "critical_error") -> str:
    protocol = SingleAgentProtocol(
        Agent(ScriptedClient(["x"])), termination=[CriticalError(info_key=key)], max_steps=5
    )
    (rollout,) = await protocol.run(ReportsEnv(key, value), env_seed=0)
    assert rollout.meta["termination_reason"] == "critical_error"
    text = rollout.meta["termination_detail"]
    assert isinstance(text, str) and json.loads(json.dumps(rollout.meta)) == rollout.meta
    assert rollout.env_steps[-1].info["termination_detail"] == text
    return text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "env step info['critical_error'] set"),
        (1, "env step info['critical_error'] = 1"),
        ({"code": 3}, "env step info['critical_error'] = {'code': 3}"),
        (RuntimeError("disk on fire"), "RuntimeError: disk on fire"),
        ("  disk on fire\n", "disk on fire"),
        ("   ", "env step info['critical_error'] set"),
    ],
)
async def test_the_detail_is_a_readable_string(value: object, expected: str) -> None:
    assert await detail(value) == expected


async def test_the_detail_names_a_custom_info_key() -> None:
    assert await detail(True, key="fatal") == "env step info['fatal'] set"
