"""A single learner rank whose `--max-wait-s` runs out after every sample it read was stale says
so, and counts them: its stop names the drops and `--max-lag` instead of "no samples arrived",
and `totals` (the closing `learner done` line) holds the samples read and dropped, which were
lost with the unfinished batch before."""

from __future__ import annotations

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.learner_report import done_line
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
        "no trainable sample arrived for 0.3s: the 3 read were all more than max_lag "
        "(--max-lag) 4 policy versions behind the learner's 5 and dropped (do the actors "
        "sample from the servers this learner publishes to? else raise --max-lag or pass "
        "--stale downweight)"
    )
    assert source.totals["samples"] == 3 and source.totals["dropped_stale"] == 3
    line = done_line(_Trainer(), {k: v for k, v in source.totals.items() if v})
    assert "0 of the 3 samples read were trained, 3 dropped as stale" in line


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
