"""Under torchrun each learner rank recovers and pins its run alone, so its lines name its rank
(`learner rank 1 acked ...`, `learner rank 1 replays ...`, `learner rank 1 trains run ...`), and
a line every rank would print alike (resuming another number of ranks' checkpoint) is printed
by rank 0 only: two ranks printed the same untagged lines. Real redis-server."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.pipeline import recovery
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.run_check import RUN_KEY
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)


def _source(server: RedisServer, rank: int) -> PipelineBatchSource:
    return PipelineBatchSource(
        _stream(server), batch_size=1, block_ms=100, rank=rank, world_size=2, lease_ttl_s=None
    )


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def test_each_ranks_recovery_and_run_lines_name_the_rank(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    for i in range(4):
        item = sample()
        meta = {**item.meta, "actor_id": "a", RUN_KEY: "run-1"}
        await stream.add(encode_sample(replace(item, meta=meta), sample_id=f"a:0:{i}"))
    ranks = [_source(redis_server, 0), _source(redis_server, 1)]
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        for source in ranks:
            await source.next_batch()
    assert sum("learner rank 1 trains run run-1" in line for line in _lines(caplog)) == 1
    assert sum("learner rank 0 trains run run-1" in line for line in _lines(caplog)) == 1
    states = [source.state_dict() for source in ranks]  # a checkpoint holds one entry per rank
    # (acked by the next read, as once a checkpoint is on disk: the restart acks none again)
    for source in ranks:
        await source.next_batch()  # read after it: replayed on restart
        await source.aclose()
    caplog.clear()
    restarted = [_source(redis_server, 0), _source(redis_server, 1)]
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        for source, state in zip(restarted, states, strict=True):
            source.load_state_dict(state)
            await source.next_batch()
    lines = _lines(caplog)
    for rank in (0, 1):
        assert f"learner rank {rank} acked 0 entries the checkpoint already holds" in lines
        assert f"learner rank {rank} replays 1 entries read but not checkpointed" in lines
    for source in restarted:
        await source.aclose()


async def test_resuming_another_number_of_ranks_is_said_by_rank_0_alone(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await stream.commit([], step=3, consumer="learner-r1")  # the old rank 1 acked it all
    resume = {"world_size": 2, "rank": 0, "batches_served": 3}
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        for rank in range(3):
            await recovery.check_world(stream, resume, consumer="learner", rank=rank, world_size=3)
    said = [line for line in _lines(caplog) if "resuming a 2-rank checkpoint on 3 ranks" in line]
    assert len(said) == 1
    await stream.aclose()
