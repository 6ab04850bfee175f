"""PipelineActor against a real redis-server with a scripted policy: every sample arrives
tagged with its policy version and credit, backpressure holds the actor back, and a restarted
actor continues its seed sequence."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest
from pipeline_fakes import CountOEnv, RedisServer, redis_server

from ludic.agents import Agent
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.pipeline.actor import PipelineActor
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training.credit import GroupNormalizedReturn
from ludic.types import Info

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


class SeedLoggingEnv(CountOEnv):
    seeds: ClassVar[list[int | None]] = []

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        SeedLoggingEnv.seeds.append(seed)
        return super().env_reset(seed)


def _actor(stream: SampleStream, client: ScriptedClient, max_backlog: int = 100) -> PipelineActor:
    engine = RolloutEngine(
        env_registry={"count_o": SeedLoggingEnv},
        protocol_registry={"single": lambda: SingleAgentProtocol(Agent(client), max_steps=1)},
    )
    request = RolloutRequest(
        env=ComponentSpec(name="count_o"),
        protocol=ComponentSpec(name="single"),
        sampling=SamplingConfig(max_tokens=8),
    )
    return PipelineActor(
        engine=engine,
        stream=stream,
        requests_fn=lambda: [request],
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        strategy=GRPORequestStrategy(group_size=2),
        seed_sequencer=SeedSequencer(run_seed=3),
        max_backlog=max_backlog,
        actor_id="a",
        poll_s=0.02,
    )


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)


async def test_samples_arrive_tagged_with_version_and_credit(redis_server: RedisServer) -> None:
    client = ScriptedClient(["oo", "x"], policy_version=7)
    actor = _actor(_stream(redis_server), client)
    history = await actor.run(num_batches=2)
    assert [s.num_samples for s in history] == [2, 2] and actor.samples_pushed == 4
    assert history[0].policy_version_min == history[0].policy_version_max == 7
    source = PipelineBatchSource(_stream(redis_server), batch_size=4, block_ms=100)
    items = (await source.next_batch()).items
    assert [i.meta["sample_id"] for i in items] == ["a:0:0", "a:0:1", "a:1:0", "a:1:1"]
    assert all(i.policy_versions == (7,) and i.meta["actor_id"] == "a" for i in items)
    # group baseline computed on the actor: rewards 2 and 0 -> advantages +1 and -1
    assert sorted(i.weight for i in items[:2]) == [-1.0, 1.0]
    assert all(i.behavior_logprobs is not None and i.num_action_tokens > 0 for i in items)


async def test_backpressure_waits_for_the_learner(redis_server: RedisServer) -> None:
    actor = _actor(_stream(redis_server), ScriptedClient(["o"]), max_backlog=2)
    await actor.run(num_batches=1)  # 2 undelivered samples: the stream is full
    blocked = asyncio.create_task(actor.step())
    await asyncio.sleep(0.3)
    assert not blocked.done() and actor.samples_pushed == 2
    source = PipelineBatchSource(_stream(redis_server), batch_size=1, block_ms=100)
    await source.next_batch()  # one delivered: backlog 1, no room for a batch of 2 yet
    await asyncio.sleep(0.3)
    assert not blocked.done() and actor.waiting_for_room
    await source.next_batch()  # both delivered: room for the next batch
    stats = await asyncio.wait_for(blocked, timeout=10)
    assert stats.backpressure_seconds > 0.2 and actor.samples_pushed == 4


async def test_a_restarted_actor_continues_its_seed_sequence(redis_server: RedisServer) -> None:
    SeedLoggingEnv.seeds.clear()
    first = _actor(_stream(redis_server), ScriptedClient(["o"]))
    assert [s.batch_index for s in await first.run(num_batches=2)] == [0, 1]
    used = set(SeedLoggingEnv.seeds)
    assert len(used) == 2  # one problem per batch, the same seed across its group of 2
    SeedLoggingEnv.seeds.clear()
    restarted = _actor(_stream(redis_server), ScriptedClient(["o"]))  # a new process, same id
    assert [s.batch_index for s in await restarted.run(num_batches=2)] == [2, 3]
    assert not set(SeedLoggingEnv.seeds) & used
    sequencer = SeedSequencer(run_seed=3)
    assert set(SeedLoggingEnv.seeds) == {sequencer.env_seed(b, 0) for b in (2, 3)}
    source = PipelineBatchSource(_stream(redis_server), batch_size=8, block_ms=100)
    ids = [i.meta["sample_id"] for i in (await source.next_batch()).items]
    assert ids == [f"a:{b}:{i}" for b in range(4) for i in range(2)]  # none dropped as repeats


async def test_a_request_given_twice_is_two_problems_in_two_groups(
    redis_server: RedisServer,
) -> None:
    # requests_fn=lambda: [problem] * 2 means two problems (each its own seeds): two GRPO
    # groups, as RolloutBatchSource makes them, not one group across both
    actor = _actor(_stream(redis_server), ScriptedClient(["oo", "x", "o", "oo"]))
    request = actor.requests_fn()[0]
    actor.requests_fn = lambda: [request, request]
    (stats,) = await actor.run(num_batches=1)
    assert stats.num_samples == 4
    source = PipelineBatchSource(_stream(redis_server), batch_size=4, block_ms=100)
    items = (await source.next_batch()).items
    groups = [i.meta["group_id"] for i in items]
    assert len(set(groups)) == 2 and groups.count(groups[0]) == 2
