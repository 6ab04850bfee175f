"""An env's `step`, `reset` and `active_agents` may only name its own seats (`agent_ids`). An
outcome keyed by a misspelt seat ("P1" for "p1") was skipped without a word: the loser never
saw its last observation, kept no -1 reward and no termination reason, and trained on that.
Now the episode fails naming the env, the method, the stray ids and the seats."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from interaction_fakes import CoinDuelEnv

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol
from ludic.types import StepOutcome


class MisspeltOutcome(CoinDuelEnv):
    """Reports the waiting seat's outcome under its name in capitals."""

    def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:
        return {
            aid if aid in actions else aid.upper(): o for aid, o in super().step(actions).items()
        }


class MisspeltReset(CoinDuelEnv):
    def reset(self, seed: int | None = None) -> dict[str, tuple[str, dict]]:
        first, second = super().reset(seed).values()
        return {"first": first, "2nd": second}


class MisspeltActive(CoinDuelEnv):
    @property
    def active_agents(self) -> Sequence[str]:
        return ("frist",)


def protocol() -> MultiAgentProtocol:
    return MultiAgentProtocol(
        {seat: Agent(ScriptedClient(["1"] * 5)) for seat in ("first", "second")}, max_steps=6
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (MisspeltOutcome(), r"MisspeltOutcome\.step named \['SECOND'\]"),
        (MisspeltReset(), r"MisspeltReset\.reset named \['2nd'\]"),
        (MisspeltActive(), r"MisspeltActive\.active_agents named \['frist'\]"),
    ],
)
async def test_an_entry_for_a_seat_the_env_does_not_have_fails_the_episode(
    env: CoinDuelEnv, named: str
) -> None:
    with pytest.raises(ValueError, match=rf"{named}.*seats \['first', 'second'\]"):
        await protocol().run(env)


async def test_an_env_naming_only_its_seats_plays_on() -> None:
    first, second = await protocol().run(CoinDuelEnv())
    assert first.env_steps[-1].reward == 1.0 and second.env_steps[-1].reward == -1.0
