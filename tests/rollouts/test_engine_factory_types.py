"""RolloutEngine registries hold factories: an env or protocol instance registered in their place
is refused when the engine is built, and a factory that builds something other than a LudicEnv
fails its episode with a message naming it, without aborting the batch (closing that object
raised outside the episode's guard and ended `generate_batch`)."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.envs import SingleAgentEnv
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, generate_batch
from ludic.types import Info, Rollout, StepOutcome


class OneTurn(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "go", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)


class Uniform:
    def assign(self, rollouts: list[Rollout]) -> dict[tuple[str, str], float]:
        return {(r.id, t.turn_id): 1.0 for r in rollouts for t in r.turns()}


def protocol() -> SingleAgentProtocol:
    return SingleAgentProtocol(Agent(ScriptedClient(["<a>1</a>"]), parser=xml_tag_parser("a")))


def request(env: str) -> RolloutRequest:
    return RolloutRequest(env=ComponentSpec(name=env), protocol=ComponentSpec(name="p"))


def test_an_env_instance_in_the_registry_is_refused_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"env_registry\['one'\] must be a factory.*OneTurn"):
        RolloutEngine(env_registry={"one": OneTurn()}, protocol_registry={"p": protocol})


def test_a_protocol_instance_in_the_registry_is_refused() -> None:
    with pytest.raises(TypeError, match=r"protocol_registry\['p'\] must be a factory"):
        RolloutEngine(env_registry={"one": OneTurn}, protocol_registry={"p": protocol()})


async def test_a_factory_that_builds_no_env_fails_its_episode_not_the_batch() -> None:
    engine = RolloutEngine(
        env_registry={"one": OneTurn, "text": lambda: "env"}, protocol_registry={"p": protocol}
    )
    batch = await generate_batch(engine, [request("text"), request("one")], Uniform())
    broken, fine = batch.rollouts
    assert broken.meta["error_phase"] == "env_factory"
    assert broken.meta["error_type"] == "TypeError"
    assert "env factory 'text' returned str 'env', not a LudicEnv" in broken.meta["error"]
    assert not fine.failed and fine.total_reward == 1.0
    assert batch.stats.num_failed == 1 and batch.stats.num_samples == 1
