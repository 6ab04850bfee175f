"""Every protocol refuses an env seed that is not an int (or None) with a TypeError naming
`env_seed`, before the env is reset; int-like seeds (numpy integers) are taken as ints."""

from __future__ import annotations

import numpy as np
import pytest
from interaction_fakes import CoinDuelEnv, CountingEnv

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import (
    DelegatingProtocol,
    MultiAgentProtocol,
    SingleAgentProtocol,
    SubAgentSpec,
)
from ludic.interaction.base import checked_env_seed
from ludic.parsers import xml_tag_parser


def agent() -> Agent:
    return Agent(ScriptedClient(["<move>1</move>"]), parser=xml_tag_parser("move"))


HELPER = SubAgentSpec(agent_factory=lambda: agent())


def protocols() -> list[tuple[object, type]]:
    return [
        (SingleAgentProtocol(agent(), max_steps=2), CountingEnv),
        (DelegatingProtocol(agent(), registry={"helper": HELPER}, max_steps=2), CountingEnv),
        (MultiAgentProtocol({"first": agent(), "second": agent()}, max_steps=2), CoinDuelEnv),
    ]


@pytest.mark.parametrize("seed", ["0", 1.0, True, b"1"])
@pytest.mark.parametrize("index", range(3))
async def test_a_non_int_seed_is_refused_naming_the_argument(seed: object, index: int) -> None:
    protocol, env_class = protocols()[index]
    env = env_class()
    with pytest.raises(TypeError, match=r"env_seed must be an int or None, got \w+ "):
        await protocol.run(env, env_seed=seed)  # type: ignore[attr-defined]
    assert getattr(env, "closed", 0) == 0  # refused before the env was touched


async def test_int_like_seeds_reach_the_env_as_ints() -> None:
    assert checked_env_seed(None) is None
    seed = checked_env_seed(np.int64(7))
    assert seed == 7 and type(seed) is int
    env = CountingEnv(length=1)
    (rollout,) = await SingleAgentProtocol(agent(), max_steps=1).run(env, env_seed=np.int64(3))
    assert rollout.meta["env_seed"] == 3 and type(rollout.meta["env_seed"]) is int
    assert rollout.steps[-1].prev_obs == "state 0 (seed 3)"
