"""An actor whose batches hold more samples than --max-backlog says so once: such a batch is
pushed only into a drained stream and the next waits until a learner has read it all, so actor
and learner take turns (README's flags: 4 problems x 8 episodes of tic-tac-toe, ~10 turn samples
each, past the default backlog of 256). A batch within the backlog says nothing."""

from __future__ import annotations

import logging

import pytest
from pipeline_fakes import CountOEnv, RedisServer, redis_server

from ludic.agents import Agent
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.pipeline.actor import PipelineActor
from ludic.pipeline.commands import LOG_FORMAT
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.rollouts import ComponentSpec, GRPORequestStrategy, RolloutEngine, RolloutRequest
from ludic.training.credit import GroupNormalizedReturn

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _actor(server: RedisServer, max_backlog: int, actor_id: str = "a") -> PipelineActor:
    request = RolloutRequest(
        env=ComponentSpec(name="count_o"),
        protocol=ComponentSpec(name="single"),
        sampling=SamplingConfig(max_tokens=8),
    )
    client = ScriptedClient(["oo", "x", "o"], policy_version=0)
    engine = RolloutEngine(
        env_registry={"count_o": CountOEnv},
        protocol_registry={"single": lambda: SingleAgentProtocol(Agent(client), max_steps=1)},
    )
    return PipelineActor(
        engine=engine,
        stream=SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2),
        requests_fn=lambda: [request],
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        strategy=GRPORequestStrategy(group_size=3),
        max_backlog=max_backlog,
        actor_id=actor_id,
        poll_s=0.02,
    )


async def test_batches_past_the_backlog_are_named_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    actor = _actor(redis_server, max_backlog=2, actor_id="actor")  # `ludic actor`'s default
    reader = PipelineBatchSource(
        SampleStream(redis_server.url, stream="s", group="g"), batch_size=3, block_ms=100
    )
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        await actor.step()
        await reader.next_batch()  # drained: the next batch may go
        await actor.step()
    await reader.aclose()
    await actor.stream.aclose()
    said = [r for r in caplog.records if "more than max_backlog" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    # as `ludic actor` logs it, after the timestamp's date and time: it read "ludic.pipeline.actor
    # actor actor's batch 0 holds ..." (the logger's name ran into the actor's)
    line = logging.Formatter(LOG_FORMAT).format(said[0]).split(" ", 2)[2]
    assert line == (
        "ludic.pipeline.actor: batch 0 of actor 'actor' holds 3 samples, more than max_backlog "
        "(--max-backlog) 2: a batch that large is pushed only into a drained stream and the next "
        "one starts only once a learner has read it all, so this actor and the learner take "
        "turns instead of working at once. Make batches smaller (--problems-per-batch, "
        "--group-size) or raise --max-backlog to 6 (two such batches; samples age while they "
        "wait in it, so keep it within what the learner's --max-lag allows)"
    )


async def test_a_batch_within_the_backlog_says_nothing(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    actor = _actor(redis_server, max_backlog=3)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        await actor.step()
    await actor.stream.aclose()
    assert not [r for r in caplog.records if "more than max_backlog" in r.getMessage()]
