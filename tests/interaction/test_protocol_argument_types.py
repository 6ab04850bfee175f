"""Protocols refuse an env or agent of the wrong kind naming it: an env class passed to `run`
failed with "argument of type 'property' is not iterable", and a string agent was accepted and
failed at `run` with "'str' object has no attribute 'agent_id'"."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.envs import TicTacToeEnv, env_parser
from ludic.inference import ScriptedClient
from ludic.interaction import (
    DelegatingProtocol,
    MultiAgentProtocol,
    SingleAgentProtocol,
    SubAgentSpec,
)


def agent() -> Agent:
    return Agent(ScriptedClient(["<move>5</move>"]), parser=env_parser("tictactoe"))


async def test_an_env_class_is_refused_asking_for_an_instance() -> None:
    with pytest.raises(TypeError, match=r"got the class TicTacToeEnv; pass an instance"):
        await SingleAgentProtocol(agent()).run(TicTacToeEnv, env_seed=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"MultiAgentProtocol.run needs a LudicEnv instance"):
        await MultiAgentProtocol({"agent_0": agent()}).run("tictactoe")  # type: ignore[arg-type]


def test_an_agent_that_is_not_an_agent_is_refused() -> None:
    with pytest.raises(TypeError, match=r"SingleAgentProtocol needs an Agent, got str 'agent'"):
        SingleAgentProtocol("agent")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"MultiAgentProtocol needs an Agent, got str"):
        MultiAgentProtocol({"X": agent(), "O": "agent"})  # type: ignore[dict-item]
    spec = SubAgentSpec(agent_factory=agent)
    with pytest.raises(TypeError, match=r"DelegatingProtocol needs an Agent, got NoneType"):
        DelegatingProtocol(None, {"helper": spec})  # type: ignore[arg-type]


async def test_an_env_instance_still_runs() -> None:
    (rollout,) = await SingleAgentProtocol(agent(), max_steps=1).run(TicTacToeEnv(), env_seed=0)
    assert rollout.env_steps[0].action == "5"
