"""`ludic actor --algorithm gigpo --gigpo.*`: the actor assigns GiGPO credit with the knobs from
its command line (fails if the actor builds its preset without them)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.cli import main as ludic_main
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
__all__ = ["redis_server"]


async def _items(server: RedisServer) -> list[Any]:
    stream = SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)
    source = PipelineBatchSource(stream, batch_size=8, block_ms=100)
    try:
        return list((await source.next_batch()).items)
    finally:
        await source.aclose()


@pytest.mark.slow
def test_actor_assigns_gigpo_credit_with_its_flags(redis_server: RedisServer) -> None:
    args = ["actor", "--redis-url", redis_server.url, "--stream", "s"]
    args += ["--env", "pipeline_fakes:CountOEnv", "--max-steps", "1", "--max-tokens", "8"]
    args += ["--problems-per-batch", "2", "--group-size", "4", "--batches", "1"]
    args += ["--algorithm", "gigpo", "--gigpo.omega", "0.3", "--gigpo.no-normalize-std"]
    args += ["--gigpo.no-step-normalize-std"]
    ludic_main(args)
    items = asyncio.run(_items(redis_server))
    assert len(items) == 8
    groups: dict[str, list[float]] = defaultdict(list)
    for item in items:
        groups[item.meta["group_id"]].append(item.meta["reward"])
    # One turn per episode, all from the same state: A_S = A_E = R - mean(group), so
    # A = A_E + 0.3 A_S = 1.3 (R - mean) (default knobs would give 2 (R - mean) / std).
    for item in items:
        rewards = groups[item.meta["group_id"]]
        expected = 1.3 * (item.meta["reward"] - sum(rewards) / len(rewards))
        assert item.weight == pytest.approx(expected, abs=1e-6)
    assert any(abs(i.weight) > 0.1 for i in items)
