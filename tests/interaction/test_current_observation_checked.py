"""An env's `current_observation` (shown below the parser's feedback after a reply that fails
to parse) must be a str or None: the protocol appends it to the feedback as text, so an
array or a dict reached the model as its repr, in silence. Now it fails that episode naming
the env's method, as a non-str observation from reset or step does."""

from __future__ import annotations

import numpy as np
import pytest
from interaction_fakes import CoinDuelEnv, CountingEnv

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import xml_tag_parser


class BoardAsArrayEnv(CountingEnv):
    def env_current_observation(self) -> object:
        return np.array([[1, 0], [0, 2]])


class DuelWithDictObservation(CoinDuelEnv):
    def current_observation(self, agent_id: str) -> object:
        return {"coins": self.coins}


def move_agent(reply: str = "no tags here") -> Agent:
    return Agent(ScriptedClient([reply]), parser=xml_tag_parser("move"))


async def test_a_single_agent_env_returning_an_array_fails_naming_its_method() -> None:
    protocol = SingleAgentProtocol(move_agent(), max_steps=2)
    with pytest.raises(
        TypeError,
        match=r"BoardAsArrayEnv\.env_current_observation returned "
        r"ndarray array\(\[\[1, 0\], \[0, 2\]\]\); .*return a str",
    ):
        await protocol.run(BoardAsArrayEnv(), env_seed=0)


async def test_a_multi_agent_env_returning_a_dict_fails_naming_its_method() -> None:
    protocol = MultiAgentProtocol({"first": move_agent(), "second": move_agent()}, max_steps=2)
    with pytest.raises(
        TypeError,
        match=r"DuelWithDictObservation\.current_observation returned "
        r"dict \{'coins': 3\}",
    ):
        await protocol.run(DuelWithDictObservation(), env_seed=0)


class BoardOverridingTheMethod(CountingEnv):
    """A SingleAgentEnv that overrides current_observation itself, not its env_ hook."""

    def current_observation(self, agent_id: str) -> object:
        return np.array([1, 2])


async def test_a_single_agent_env_overriding_the_method_itself_is_named_by_it() -> None:
    """Named by the method it wrote (every SingleAgentEnv has the hook, so asking whether the
    env has it named a method this env never wrote)."""
    protocol = SingleAgentProtocol(move_agent(), max_steps=2)
    with pytest.raises(TypeError, match=r"BoardOverridingTheMethod\.current_observation returned"):
        await protocol.run(BoardOverridingTheMethod(), env_seed=0)


class BoardAsTextEnv(CountingEnv):
    def env_current_observation(self) -> str:
        return "board: X.O"


async def test_a_str_is_shown_below_the_feedback() -> None:
    (rollout,) = await SingleAgentProtocol(move_agent(), max_steps=1).run(BoardAsTextEnv())
    (step,) = rollout.env_steps
    assert step.next_obs is not None and step.next_obs.endswith("\nboard: X.O")
