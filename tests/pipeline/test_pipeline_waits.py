"""A learner whose batch does not fill says so while it waits, and why as far as it can tell:
no sample arrives (no actor on this stream), every sample arrives stale (the actors sample a
policy the learner does not publish to), or the actors are slower than the learner; a sample
newer than the learner is named once. Against a real redis-server."""

from __future__ import annotations

import logging

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import BatchSourceExhausted

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]
_STREAM, _CONSUMER = "waits", "waits"  # named in this file's source's lines (its lease's too)


def _own_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages of this test's source: its notices, and any line naming its stream or its
    consumer (its lease's). Not another test's leftover source, such as a lease thread warning
    that its stopped redis-server is unreachable."""
    own = (f"stream {_STREAM!r}", f"{_CONSUMER}-r0")
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ludic.pipeline.source" or any(name in r.getMessage() for name in own)
    ]


async def _wait_out(
    server: RedisServer, *, pushed: int, versions: tuple[int, ...] = (), notice_s: float = 0.3
) -> BatchSourceExhausted | None:
    """Push `pushed` samples, then draw one batch of 4 (the learner at version 5, max_lag 1)
    with short waits (a notice every `notice_s`); what it raised, if anything."""
    stream = SampleStream(server.url, stream=_STREAM, group="g", retry_cap_s=0.2)
    await stream.ensure_group()
    for i in range(pushed):
        await stream.add(encode_sample(sample(versions=versions), sample_id=f"id{i}"))
    source = PipelineBatchSource(
        stream,
        batch_size=4,
        consumer=_CONSUMER,
        block_ms=100,
        max_wait_s=1.5,
        wait_notice_s=notice_s,
        max_lag=1,
        current_version=lambda: 5,
    )
    raised: BatchSourceExhausted | None = None
    try:
        await source.next_batch()
    except BatchSourceExhausted as e:
        raised = e
    finally:
        await source.aclose()
    return raised


async def test_no_sample_names_the_stream_and_the_actor(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        raised = await _wait_out(redis_server, pushed=0)
    assert isinstance(raised, BatchSourceExhausted)
    lines = _own_lines(caplog)
    assert len(lines) >= 2  # repeated while it waits
    assert lines[0].startswith("learner rank 0 has 0 of 4 samples for its next step after ")
    assert "on stream 'waits' (group 'g'); no sample arrived: is an actor pushing" in lines[0]
    assert "or is its first batch still generating (an actor pushes" in lines[0]  # not an error


async def test_stale_samples_name_max_lag_and_the_server(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        raised = await _wait_out(redis_server, pushed=3, versions=(0,))
    assert isinstance(raised, BatchSourceExhausted)
    text = _own_lines(caplog)[0]
    assert "has 0 of 4 samples" in text and "on stream 'waits'" in text
    assert (
        "3 arrived more than max_lag (--max-lag) 1 policy versions behind the learner's 5 and "
        "were dropped: do the actors sample from the servers this learner publishes to"
    ) in text
    assert "Samples that waited in the stream (a backlog" in text  # the other usual cause


async def test_a_partial_batch_says_the_actors_are_slower(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        raised = await _wait_out(redis_server, pushed=2, versions=(5,))
    assert raised is None  # max_wait_s returns the partial batch
    text = _own_lines(caplog)[0]
    assert "has 2 of 4 samples" in text and "on stream 'waits'" in text
    assert "the actors push samples slower" in text


async def test_a_full_batch_waits_in_silence(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Silent however long the read that filled it took (notice_s=0: every read is "late"; a
    read slower than the notice interval, as on a loaded machine, logged "has 4 of 4")."""
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        raised = await _wait_out(redis_server, pushed=4, versions=(5,), notice_s=0.0)
    assert raised is None and _own_lines(caplog) == []


async def test_a_sample_newer_than_the_learner_is_named_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Samples a server made with another run's weights (version 9 against the learner's 5)
    are trained, not dropped, with one warning naming both versions and the likely cause."""
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        raised = await _wait_out(redis_server, pushed=4, versions=(9,))
    assert raised is None
    [warning] = _own_lines(caplog)
    assert warning.startswith("a sample carries policy version 9, newer than this learner's 5")
    assert "start with a new --stream and restart the server" in warning
