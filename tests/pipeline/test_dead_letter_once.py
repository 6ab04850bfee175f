"""An entry the learner dead-letters is copied to `<stream>:dead` once, keyed by its entry id:
a learner restarted before any checkpoint acknowledged it replays the entry and dead-letters
it again, which adds no second copy; a retried call adds none either. Once the entry is
committed its mark goes. Real redis-server."""

from __future__ import annotations

import pytest
from pipeline_fakes import RedisServer, expire_leases, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream, StreamEntry

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)


async def test_a_replayed_bad_entry_is_dead_lettered_once_across_a_restart(
    redis_server: RedisServer,
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    bad = await stream.add({b"h": b"garbage", b"b": b""})
    for i in range(3):
        await stream.add(encode_sample(sample(), sample_id=f"id{i}"))
    first = PipelineBatchSource(stream, batch_size=2, block_ms=100)
    await first.next_batch()  # reads the bad entry (dead-lettered), id0, id1; no checkpoint
    assert redis_server.client().xlen("s:dead") == 1
    expire_leases(first)  # killed before any checkpoint acked what it read

    restarted = PipelineBatchSource(_stream(redis_server), batch_size=2, block_ms=100)
    batch = await restarted.next_batch()  # replays the bad entry, id0, id1 (its pending ones)
    assert batch.stats["pipeline/invalid"] == 1.0
    [(_, dead)] = redis_server.client().xrange("s:dead")
    assert dead[b"entry_id"] == bad.encode() and dead[b"h"] == b"garbage"

    await restarted.commit()
    assert redis_server.client().hlen("s:dead:ids") == 0  # acked: never read again
    assert redis_server.client().xlen("s:dead") == 1
    await restarted.aclose()


async def test_dead_letter_copies_an_entry_once_per_entry_id(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    entry = StreamEntry(entry_id="5-0", fields={b"h": b"x"})
    assert await stream.dead_letter(entry, "garbage")
    assert not await stream.dead_letter(entry, "garbage")  # a retry, or a replay
    assert await stream.dead_letter(StreamEntry(entry_id="6-0", fields=None), "trimmed")
    assert [f[b"entry_id"] for _, f in redis_server.client().xrange("s:dead")] == [b"5-0", b"6-0"]
    await stream.aclose()
