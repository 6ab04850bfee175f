"""MultiAgentProtocol's error for agents keyed by names that are not the env's seats names the
seats and the stray keys (a case typo, `"x"` for `"X"`, read as 'no agent' before)."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.envs import TicTacToeDuelEnv, env_parser
from ludic.inference import ScriptedClient
from ludic.interaction import MultiAgentProtocol


def _agent() -> Agent:
    return Agent(ScriptedClient(["<move>5</move>"]), parser=env_parser("tictactoe_duel"))


async def test_stray_agent_keys_are_named_beside_the_seats() -> None:
    protocol = MultiAgentProtocol({"x": _agent(), "O": _agent()})
    with pytest.raises(ValueError) as err:
        await protocol.run(TicTacToeDuelEnv(), env_seed=0)
    message = str(err.value)
    assert "no agent for env seat(s) ['X']" in message
    assert "the env's seats: ['X', 'O']" in message
    assert "agents given for ['x'], which are not seats" in message
    assert "keyed by env.agent_ids" in message


async def test_missing_seat_without_strays_names_only_the_seats() -> None:
    with pytest.raises(ValueError, match=r"seat\(s\) \['O'\] \(the env's seats: \['X', 'O'\]\)"):
        await MultiAgentProtocol({"X": _agent()}).run(TicTacToeDuelEnv(), env_seed=0)
