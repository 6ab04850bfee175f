"""--max-backlog bounds the stream's undelivered samples whatever the number of actors: two
actors that both found the stream empty before generating a batch push one batch, and the other
waits until a learner reads it (each used to check before its batch and push it whole, so two
took the backlog to twice the bound). Real redis-server."""

from __future__ import annotations

import asyncio

import pytest
from pipeline_fakes import CountOEnv, RedisServer, redis_server

from ludic.agents import Agent
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.pipeline.actor import PipelineActor
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.rollouts import ComponentSpec, GRPORequestStrategy, RolloutEngine, RolloutRequest
from ludic.training.credit import GroupNormalizedReturn

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]

BOUND = 4  # one batch: a group of 4 one-step episodes, one sample each


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)


def _actor(server: RedisServer, actor_id: str) -> PipelineActor:
    engine = RolloutEngine(
        env_registry={"count_o": CountOEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["o"])), max_steps=1)
        },
    )
    request = RolloutRequest(
        env=ComponentSpec(name="count_o"),
        protocol=ComponentSpec(name="single"),
        sampling=SamplingConfig(max_tokens=8),
    )
    return PipelineActor(
        engine=engine,
        stream=_stream(server),
        requests_fn=lambda: [request],
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        strategy=GRPORequestStrategy(group_size=BOUND),
        max_backlog=BOUND,
        actor_id=actor_id,
        poll_s=0.02,
    )


async def test_two_actors_never_take_the_backlog_past_max_backlog(
    redis_server: RedisServer,
) -> None:
    actors = [_actor(redis_server, "a"), _actor(redis_server, "b")]
    await actors[0].stream.ensure_group()
    steps = [asyncio.create_task(actor.step()) for actor in actors]
    # both start on an empty stream; once one batch is in, the other must wait for room
    while not all(s.done() for s in steps) and not any(a.waiting_for_room for a in actors):
        await asyncio.sleep(0.01)
    redis = redis_server.client()
    assert redis.xlen("s") == BOUND  # not 2 * BOUND
    [waiting] = [actor for actor, step in zip(actors, steps, strict=True) if not step.done()]
    assert waiting.waiting_for_room and waiting.samples_pushed == 0
    source = PipelineBatchSource(_stream(redis_server), batch_size=BOUND, block_ms=100)
    first = await source.next_batch()  # the learner reads one batch: room for the other
    await asyncio.wait_for(asyncio.gather(*steps), timeout=30)
    assert redis.xlen("s") == 2 * BOUND  # the first batch read (pending), the second undelivered
    await source.commit()
    second = await source.next_batch()
    ids = {i.meta["sample_id"] for i in first.items + second.items}
    assert ids == {f"{a}:0:{i}" for a in "ab" for i in range(BOUND)}  # every sample, once
    await source.aclose()
    for actor in actors:
        await actor.stream.aclose()
