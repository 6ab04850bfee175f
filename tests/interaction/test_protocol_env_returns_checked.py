"""Protocols check what any LudicEnv returns, not only a SingleAgentEnv: a hand-written or
multi-agent env whose reset gives a dict observation or whose step gives reward="high" used
to pass it straight into `EnvironmentStep.reward`, and the str reward crashed the whole run in
credit assignment. Now the episode fails with the same message SingleAgentEnv gives, naming
the env, the method and the seat; a SingleAgentEnv (which checks itself) is not checked twice."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from interaction_fakes import CoinDuelEnv, CountingEnv

import ludic.interaction.base as interaction_base
from ludic.agents import Agent
from ludic.envs import LudicEnv, returns_checked
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.types import StepOutcome


class HandWritten(LudicEnv):
    """A one-seat env written against LudicEnv directly, returning what it is told to."""

    def __init__(self, reset: Any = None, step: Any = None) -> None:
        self.reset_value = {"solo": ("start", {})} if reset is None else reset
        self.step_value = {"solo": StepOutcome(obs="ok", reward=1.0)} if step is None else step

    @property
    def agent_ids(self) -> Sequence[str]:
        return ("solo",)

    @property
    def active_agents(self) -> Sequence[str]:
        return ("solo",)

    def reset(self, seed: int | None = None) -> Any:
        return self.reset_value

    def step(self, actions: Mapping[str, str]) -> Any:
        return self.step_value


def solo() -> SingleAgentProtocol:
    return SingleAgentProtocol(Agent(ScriptedClient(["a", "b"])), max_steps=2)


@pytest.mark.parametrize(
    ("env", "error", "message"),
    [
        (
            HandWritten(step={"solo": StepOutcome(obs="x", reward="high")}),  # type: ignore[arg-type]
            TypeError,
            r"HandWritten.step for 'solo' returned a StepOutcome whose reward is 'high' \(a str\)",
        ),
        (
            HandWritten(step={"solo": StepOutcome(obs="x", reward=float("nan"))}),
            ValueError,
            r"HandWritten.step for 'solo' returned a StepOutcome whose reward is nan; .*finite",
        ),
        (
            HandWritten(step={"solo": StepOutcome(obs={"board": 1}, reward=0.0)}),  # type: ignore[arg-type]
            TypeError,
            r"HandWritten.step for 'solo' returned a StepOutcome whose obs is .*return a str",
        ),
        (
            HandWritten(step={"solo": ("x", 1.0, True)}),
            TypeError,
            r"HandWritten.step for 'solo' must return a StepOutcome\(obs=",
        ),
        (
            HandWritten(step=[StepOutcome(obs="x", reward=1.0)]),
            TypeError,
            r"HandWritten.step must return a dict \{agent_id: StepOutcome\}, got list",
        ),
        (
            HandWritten(reset={"solo": ({"board": 1}, {})}),
            TypeError,
            r"HandWritten.reset for 'solo' returned the observation .* \(a dict\)",
        ),
        (
            HandWritten(reset={"solo": ("start", None)}),
            TypeError,
            r"HandWritten.reset for 'solo' returned the info None",
        ),
        (  # was a bare KeyError: 'solo'; a key that is not a seat is named as such
            HandWritten(reset={"player": ("start", {})}),
            ValueError,
            r"HandWritten.reset named \['player'\], which are not among its seats \['solo'\]",
        ),
        (
            HandWritten(step={"player": StepOutcome(obs="x", reward=1.0)}),
            ValueError,
            r"HandWritten.step named \['player'\], which are not among its seats \['solo'\]",
        ),
        (
            HandWritten(step={}),
            KeyError,
            r"HandWritten.step returned nothing for agent 'solo' \(it returned entries for \[\]\)",
        ),
    ],
)
async def test_a_hand_written_env_is_checked_by_the_single_agent_protocol(
    env: HandWritten, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        await solo().run(env, env_seed=0)


async def test_what_is_right_reaches_the_rollout_unchanged() -> None:
    (rollout,) = await solo().run(HandWritten(), env_seed=0)
    assert [s.reward for s in rollout.env_steps] == [1.0, 1.0]


class BadRewardDuel(CoinDuelEnv):
    """The coin game, but the waiting seat's outcome carries a str reward."""

    def step(self, actions: Mapping[str, str]) -> Any:
        outcomes = super().step(actions)
        (waiting,) = (seat for seat in self.agent_ids if seat not in actions)
        outcomes[waiting] = dataclasses.replace(outcomes[waiting], reward="high")  # type: ignore[arg-type]
        return outcomes


class DictObservationDuel(CoinDuelEnv):
    def reset(self, seed: int | None = None) -> Any:
        return {**super().reset(seed), "second": ({"coins": 3}, {})}


def duel() -> MultiAgentProtocol:
    agents = {seat: Agent(ScriptedClient(["1", "1"])) for seat in ("first", "second")}
    return MultiAgentProtocol(agents, max_steps=4)


async def test_every_outcome_of_a_multi_agent_env_is_checked_not_only_the_movers() -> None:
    with pytest.raises(TypeError, match=r"BadRewardDuel.step for 'second' returned a Step"):
        await duel().run(BadRewardDuel(), env_seed=0)
    with pytest.raises(TypeError, match=r"DictObservationDuel.reset for 'second' returned the"):
        await duel().run(DictObservationDuel(), env_seed=0)


async def test_a_single_agent_env_is_not_checked_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counting(outcome: object, *, where: str) -> StepOutcome:
        calls.append(where)
        return outcome  # type: ignore[return-value]

    monkeypatch.setattr(interaction_base, "check_step_outcome", counting)
    assert returns_checked(CountingEnv()) and not returns_checked(HandWritten())
    await solo().run(CountingEnv(length=2), env_seed=0)
    assert calls == []
    await solo().run(HandWritten(), env_seed=0)
    assert calls == ["HandWritten.step for 'solo'", "HandWritten.step for 'solo'"]
