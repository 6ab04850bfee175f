"""A learner whose `--max-wait-s` runs out after every sample it read was stale says
so, and counts them: its stop names the drops and `--max-lag` instead of "no samples arrived",
and `totals` (the closing `learner done` line) holds the samples read and dropped, which were
lost with the unfinished batch before."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.learner_report import done_line, report_step
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import BatchSourceExhausted

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


class _Trainer:  # what `done_line` reads of a Trainer without checkpoints
    step = 5
    checkpoints = None


async def test_a_wait_that_ends_on_stale_samples_names_and_counts_them(
    redis_server: RedisServer,
) -> None:
    stream = SampleStream(redis_server.url, stream="s", group="g", retry_cap_s=0.2)
    source = PipelineBatchSource(
        stream,
        batch_size=4,
        block_ms=50,
        max_wait_s=0.3,
        max_lag=4,
        current_version=lambda: 5,  # the samples' version 0 is 5 behind: stale
        lease_ttl_s=None,
    )
    for i in range(3):
        await stream.add(encode_sample(sample(versions=(0,)), sample_id=f"id{i}"))
    try:
        with pytest.raises(BatchSourceExhausted) as e:
            await source.next_batch()
    finally:
        await source.aclose()
    assert str(e.value) == (
        "no trainable sample arrived for 0.3s: 3 read were more than max_lag (--max-lag) 4 "
        "policy versions behind the learner's 5 and dropped (do the actors sample from the "
        "servers this learner publishes to? else raise --max-lag or pass --stale downweight)"
    )
    assert source.totals["samples"] == 3 and source.totals["dropped_stale"] == 3
    line = done_line(_Trainer(), {k: v for k, v in source.totals.items() if v})
    assert "3 samples read, 0 of them trained, 3 dropped as stale (more than --max-lag" in line


async def test_a_wait_on_an_empty_stream_still_says_nothing_arrived(
    redis_server: RedisServer,
) -> None:
    stream = SampleStream(redis_server.url, stream="s", group="g", retry_cap_s=0.2)
    source = PipelineBatchSource(
        stream, batch_size=4, block_ms=50, max_wait_s=0.2, lease_ttl_s=None
    )
    try:
        with pytest.raises(BatchSourceExhausted, match=r"^no samples arrived for 0.2s$"):
            await source.next_batch()
    finally:
        await source.aclose()
    assert not source.totals["samples"]


class _OtherRankAlike:
    """A 2-rank runtime whose other rank holds the same numbers as this one."""

    world_size = 2

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return [2 * v for v in values]


async def test_ranks_that_all_time_out_on_stale_samples_name_them_in_the_stop(
    redis_server: RedisServer,
) -> None:
    """With several ranks the source returns an empty, timed-out batch (a rank that raised
    would strand the others in a collective); the stop `report_step` returns for the learner
    sums every rank's stale drops instead of saying no samples arrived. A duplicate read in
    the same wait is not counted among them."""
    stream = SampleStream(redis_server.url, stream="s", group="g", retry_cap_s=0.2)
    source = PipelineBatchSource(
        stream,
        batch_size=4,
        block_ms=50,
        max_wait_s=0.3,
        max_lag=4,
        current_version=lambda: 5,
        lease_ttl_s=None,
        rank=0,
        world_size=2,
    )
    for i in range(3):
        await stream.add(encode_sample(sample(versions=(0,)), sample_id=f"id{i}"))
    await stream.add(encode_sample(sample(versions=(0,)), sample_id="id0"))  # a duplicate
    try:
        batch = await source.next_batch()
    finally:
        await source.aclose()
    assert not batch.items and source.timed_out and source.timed_out_dropped == 3
    trainer = SimpleNamespace(step=5, runtime=_OtherRankAlike(), checkpoints=None)
    stop = report_step(trainer, source, {"num_samples": 0.0})
    assert stop == (
        "no trainable sample arrived for 0.3s on any of the 2 ranks: 6 read were more than "
        "max_lag (--max-lag) 4 policy versions behind the learner's 5 and dropped (do the "
        "actors sample from the servers this learner publishes to? else raise --max-lag or "
        "pass --stale downweight)"
    )
