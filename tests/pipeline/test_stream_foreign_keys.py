"""Another program's data under one of the stream's keys (the stream itself, its dead letters,
its ledger): Redis answers WRONGTYPE, which named no key; `ludic learner` and `ludic actor`
died with a redis-py traceback. Now a LudicUsageError (their one `error:` line) names the key,
what it holds and the fix. A real redis-server."""

from __future__ import annotations

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.errors import LudicUsageError
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream, StreamEntry

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)


async def test_a_string_at_the_stream_key_is_named_at_the_first_command(
    redis_server: RedisServer,
) -> None:
    redis_server.client().set("s", "someone else's")
    with pytest.raises(LudicUsageError) as caught:
        await _stream(redis_server).ensure_group()
    message = str(caught.value)
    assert "XGROUP CREATE failed: key 's' holds a string, not a Ludic stream" in message
    assert "Pass another --stream" in message and "redis-cli DEL KEY" in message


async def test_foreign_dead_letter_and_ledger_keys_are_named(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    redis_server.client().rpush("s:dead", "x")
    with pytest.raises(LudicUsageError, match="key 's:dead' holds a list, not a Ludic stream"):
        await stream.dead_letter(StreamEntry(entry_id="1-0", fields={b"h": b"x"}), "garbage")
    redis_server.client().delete("s:dead")
    redis_server.client().hset("s:ledger", "a", "b")
    await stream.add(encode_sample(sample(4), sample_id="id0"))
    source = PipelineBatchSource(stream, batch_size=1, block_ms=100, ack="step")
    await source.next_batch()
    with pytest.raises(LudicUsageError, match="key 's:ledger' holds a hash"):
        await source.next_batch()  # acks the first batch: the commit writes the ledger
