"""What a SingleAgentEnv's `env_reset` / `env_step` return is checked where it leaves the env:
an observation that is not a str, a step that returns no StepOutcome, or a reward that is not a
finite number is refused naming the method and the fix. They used to fail later and elsewhere:
a dict observation as "the chat template failed ... can only concatenate str (not "dict")", a
tuple as "'tuple' object has no attribute 'obs'", and a str reward crashed the whole training
run in the credit assigner (a TypeError traceback from `Rollout.reward`)."""

from __future__ import annotations

from typing import Any

import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Info, StepOutcome


class Returns(SingleAgentEnv):
    """Returns whatever it is told to, from env_reset and env_step."""

    def __init__(self, reset: Any = ("start", {}), step: Any = None) -> None:
        self.reset_value = reset
        self.step_value = StepOutcome(obs="ok", reward=1.0) if step is None else step

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return self.reset_value  # type: ignore[no-any-return]

    def env_step(self, action: str) -> StepOutcome:
        return self.step_value  # type: ignore[no-any-return]


class AsyncReturns(Returns):
    async def env_reset(self, seed: int | None = None) -> tuple[str, Info]:  # type: ignore[override]
        return self.reset_value  # type: ignore[no-any-return]

    async def env_step(self, action: str) -> StepOutcome:  # type: ignore[override]
        return self.step_value  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("reset", "message"),
    [
        ({"board": [1, 2]}, r"Returns.env_reset must return \(observation, info\), got \{'board'"),
        (
            ({"board": [1, 2]}, {}),
            r"env_reset returned the observation .* \(a dict\); .*return a str",
        ),
        ((None, {}), r"env_reset returned the observation None \(a NoneType\)"),
        (("start", None), r"env_reset returned the info None .*return a dict"),
    ],
)
def test_a_bad_reset_is_refused_naming_the_method(reset: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Returns(reset=reset).reset(0)


@pytest.mark.parametrize(
    ("step", "error", "message"),
    [
        (("obs", 1.0, True), TypeError, r"env_step must return a StepOutcome\(obs=.*got \('obs'"),
        (StepOutcome(obs=42, reward=0.0), TypeError, r"whose obs is 42 \(a int\); .*return a str"),  # type: ignore[arg-type]
        (StepOutcome(obs="x", reward="high"), TypeError, r"whose reward is 'high' \(a str\)"),  # type: ignore[arg-type]
        (StepOutcome(obs="x", reward=None), TypeError, r"whose reward is None"),  # type: ignore[arg-type]
        (StepOutcome(obs="x", reward=float("nan")), ValueError, r"reward is nan; .*finite"),
        (StepOutcome(obs="x", reward=float("inf")), ValueError, r"reward is inf; .*finite"),
    ],
)
def test_a_bad_step_is_refused_naming_the_method(step: Any, error: type, message: str) -> None:
    env = Returns(step=step)
    env.reset(0)
    with pytest.raises(error, match=message):
        env.step({"agent_0": "go"})


async def test_an_async_env_is_checked_when_awaited() -> None:
    env = AsyncReturns(reset=([1], {}), step=("obs", 1.0, True))
    with pytest.raises(TypeError, match=r"AsyncReturns.env_reset returned the observation \[1\]"):
        await env.reset(0)  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"AsyncReturns.env_step must return a StepOutcome"):
        await env.step({"agent_0": "go"})  # type: ignore[misc]


def test_what_is_right_passes_unchanged() -> None:
    outcome = StepOutcome(obs="ok", reward=1, terminated=True)  # an int reward is a number
    env = Returns(reset=["start", {"k": 1}], step=outcome)  # a list pair reads as the pair
    assert env.reset(0) == {"agent_0": ("start", {"k": 1})}
    assert env.step({"agent_0": "go"}) == {"agent_0": outcome}


async def test_the_protocol_fails_the_episode_with_the_env_named() -> None:
    agent = Agent(ScriptedClient(["a"]))
    env = Returns(step=StepOutcome(obs="x", reward="high"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Returns.env_step returned a StepOutcome whose reward"):
        await SingleAgentProtocol(agent, max_steps=2).run(env, env_seed=0)


def test_a_bool_or_numpy_reward_is_read_as_a_float() -> None:
    """`StepOutcome(reward=solved)` trained as 1.0 / 0.0 before the checks; it still does, and
    the recorded reward is a plain float (a numpy float32 would not serialise to JSON)."""
    import numpy as np

    for reward, expected in ((True, 1.0), (False, 0.0), (np.float32(0.5), 0.5), (3, 3.0)):
        env = Returns(step=StepOutcome(obs="ok", reward=reward))  # type: ignore[arg-type]
        (outcome,) = env.step({"agent_0": "go"}).values()  # type: ignore[union-attr]
        assert type(outcome.reward) is float and outcome.reward == expected
