"""An actor started before a learner of another run on its stream stops before it pushes a batch
that learner would dead-letter: the live learner's run (which its lease publishes) is read again
before each batch is pushed, one Redis read a batch, not only when the actor starts. The message
names the batch dropped, both runs, the learner and the fixes."""

from __future__ import annotations

import pytest
from pipeline_fakes import CountOEnv, RedisServer, redis_server

from ludic.agents import Agent
from ludic.errors import LudicUsageError
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.pipeline.actor import PipelineActor
from ludic.pipeline.lease import ConsumerLease
from ludic.pipeline.stream import SampleStream
from ludic.rollouts import ComponentSpec, GRPORequestStrategy, RolloutEngine, RolloutRequest
from ludic.training.credit import GroupNormalizedReturn

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


async def test_a_learner_of_another_run_started_later_stops_the_actor_before_its_push(
    redis_server: RedisServer,
) -> None:
    learner = ConsumerLease(redis_server.url, stream="s", group="g", consumer="learner-r0")
    request = RolloutRequest(
        env=ComponentSpec(name="count_o"),
        protocol=ComponentSpec(name="single"),
        sampling=SamplingConfig(max_tokens=8),
    )

    def requests() -> list[RolloutRequest]:
        if actor.batch_index == 1:  # the second batch generates: a learner starts meanwhile
            learner.acquire()
            learner.publish_run("run-b")
        return [request]

    client = ScriptedClient(["oo", "x"], policy_version=0)
    engine = RolloutEngine(
        env_registry={"count_o": CountOEnv},
        protocol_registry={"single": lambda: SingleAgentProtocol(Agent(client), max_steps=1)},
    )
    actor = PipelineActor(
        engine=engine,
        stream=SampleStream(redis_server.url, stream="s", group="g", retry_cap_s=0.2),
        requests_fn=requests,
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        strategy=GRPORequestStrategy(group_size=2),
        actor_id="a",
        run_id="run-a",
    )
    try:
        with pytest.raises(LudicUsageError) as stopped:
            await actor.run(num_batches=3)
    finally:
        learner.release()
        await actor.stream.aclose()
    message = str(stopped.value)
    assert message.startswith("actor 'a' stops without pushing its batch 1: since it started, ")
    assert "is read by a live learner (host " in message
    assert "trains run run-b, but this actor ('a') is run run-a:" in message
    assert "pass --run-id run-b" in message and "--stream" in message
    assert redis_server.client().xlen("s") == 2  # the first batch only
