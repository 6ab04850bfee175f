"""Redis restarted without its data (no --appendonly) under a running pipeline: an actor that
lives through it continues its batches, saying that Redis lost its counter, instead of repeating
batch 0's seeds and sample ids; a learner that reads an id it already trained (an actor restarted
after the loss, counting from 0 again) says why they are dropped and what to do. Real
redis-server; FLUSHALL stands for the restart that lost the data."""

from __future__ import annotations

import logging

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
from ludic.training import BatchSourceExhausted
from ludic.training.credit import GroupNormalizedReturn

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)


def _actor(server: RedisServer) -> PipelineActor:
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
        strategy=GRPORequestStrategy(group_size=2),
        actor_id="a",
    )


async def test_an_actor_living_through_a_data_loss_continues_its_batches(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    actor = _actor(redis_server)
    await actor.run(num_batches=2)
    redis_server.client().flushall()
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        stats = await actor.step()
    assert stats.batch_index == 2  # not 0 again: its seeds and sample ids are not repeated
    assert "redis lost actor 'a''s batch counter (it gave batch 0 after 1)" in caplog.text
    assert "continues at batch 2" in caplog.text and "--appendonly yes" in caplog.text
    assert (await actor.step()).batch_index == 3  # the counter was raised: no second warning
    assert caplog.text.count("lost actor") == 1
    await actor.stream.aclose()


async def test_a_learner_says_why_an_actor_restarted_after_a_data_loss_is_dropped(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    first = _actor(redis_server)
    await first.run(num_batches=1)
    await first.stream.aclose()
    source = PipelineBatchSource(_stream(redis_server), batch_size=2, block_ms=100, max_wait_s=1)
    assert len((await source.next_batch()).items) == 2
    await source.commit()
    redis_server.client().flushall()
    restarted = _actor(redis_server)  # a new process: it cannot tell its counter was lost
    await restarted.run(num_batches=1)
    await restarted.stream.aclose()
    with (
        caplog.at_level(logging.WARNING, logger="ludic.pipeline"),
        pytest.raises(BatchSourceExhausted),
    ):
        await source.next_batch()
    assert source.totals["duplicates"] == 2
    assert caplog.text.count("repeats sample id") == 1  # once, not per sample
    assert "repeats sample id 'a:0:0', which this learner already read" in caplog.text
    assert "restart actor 'a' with a new --actor-id" in caplog.text
    await source.aclose()
