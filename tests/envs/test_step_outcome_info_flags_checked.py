"""A StepOutcome's `info` and its `terminated` / `truncated` flags are checked where they leave
the env, like its obs and reward. A list as info failed the episode later, in the protocol, as
"dictionary update sequence element #0 has length 1; 2 is required", naming neither the env
nor the field; a str flag such as terminated="False" silently ended every episode; a numpy
bool (what Gymnasium envs return) reached the rollout records, which JSON cannot write."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv, check_step_outcome
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Info, StepOutcome


class OneStep(SingleAgentEnv):
    """Starts at "start"; its one step returns `outcome`."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "start", {}

    def env_step(self, action: str) -> StepOutcome:
        return self.outcome  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (
            StepOutcome(obs="x", info=["a"]),  # type: ignore[arg-type]
            r"OneStep.env_step returned a StepOutcome whose info is \['a'\] \(a list\); "
            r"return a dict \(\{\}: none\)",
        ),
        (
            StepOutcome(obs="x", info=None),  # type: ignore[arg-type]
            r"whose info is None \(a NoneType\)",
        ),
        (
            StepOutcome(obs="x", terminated="False"),  # type: ignore[arg-type]
            r"whose terminated is 'False' \(a str\); terminated must be True or False",
        ),
        (
            StepOutcome(obs="x", truncated=None),  # type: ignore[arg-type]
            r"whose truncated is None \(a NoneType\); truncated must be True or False",
        ),
        (
            StepOutcome(obs="x", terminated=2),
            r"whose terminated is 2 \(a int\)",
        ),
    ],
)
def test_a_bad_info_or_flag_is_refused_naming_the_method(outcome: Any, message: str) -> None:
    env = OneStep(outcome)
    env.reset(0)
    with pytest.raises(TypeError, match=message):
        env.step({"agent_0": "go"})


async def test_the_episode_fails_naming_the_info_not_a_dict_update() -> None:
    env = OneStep(StepOutcome(obs="x", terminated=True, info=["a"]))  # type: ignore[arg-type]
    protocol = SingleAgentProtocol(Agent(ScriptedClient(["go"])), max_steps=2)
    with pytest.raises(TypeError, match=r"OneStep.env_step returned a StepOutcome whose info"):
        await protocol.run(env, env_seed=0)


@pytest.mark.parametrize("flag", [np.bool_(True), 1, True])
def test_numpy_and_int_flags_are_read_as_plain_bools(flag: Any) -> None:
    outcome = check_step_outcome(
        StepOutcome(obs="x", terminated=flag, truncated=np.bool_(False)), where="Env.step"
    )
    assert outcome.terminated is True and outcome.truncated is False
    json.dumps({"terminated": outcome.terminated, "truncated": outcome.truncated})


def test_a_plain_outcome_is_returned_as_is() -> None:
    outcome = StepOutcome(obs="x", reward=0.5, terminated=True, info={"k": 1})
    assert check_step_outcome(outcome, where="Env.step") is outcome
