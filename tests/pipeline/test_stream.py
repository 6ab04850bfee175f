"""SampleStream against a real redis-server: delivery, atomic idempotent commits, the ledger,
backlog, pending replay, claiming, and recovery from a Redis restart or data loss."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pipeline_fakes import RedisServer, free_port, redis_server
from redis.exceptions import ConnectionError as RedisConnectionError

from ludic.pipeline.stream import RedisUnavailableError, SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _stream(server: RedisServer, **kwargs: object) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2, **kwargs)  # type: ignore[arg-type]


async def test_add_read_commit_and_backlog(redis_server: RedisServer) -> None:
    stream = _stream(redis_server, ledger="s:ledger")
    await stream.ensure_group()
    ids = [await stream.add({b"h": str(i).encode(), b"b": b""}) for i in range(5)]
    assert await stream.backlog() == 5
    got = await stream.read("c", count=3, block_ms=100)
    assert [e.entry_id for e in got] == ids[:3] and got[0].fields == {b"h": b"0", b"b": b""}
    assert await stream.backlog() == 2  # delivered entries no longer count
    pairs = [(e.entry_id, f"sample{i}") for i, e in enumerate(got)]
    assert await stream.commit(pairs, step=1) == 3
    assert await stream.commit(pairs, step=1) == 0  # a retried commit changes nothing
    client = redis_server.client()
    assert client.xlen("s") == 2  # committed entries are deleted
    ledger = client.xrange("s:ledger")
    assert len(ledger) == 1 and json.loads(ledger[0][1][b"ids"]) == [
        "sample0",
        "sample1",
        "sample2",
    ]
    assert await stream.read("c", count=10, block_ms=100) != []
    assert await stream.read("c", count=10, block_ms=50) == []
    await stream.aclose()


async def test_pending_entries_are_replayed_and_idle_ones_claimed(
    redis_server: RedisServer,
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    ids = [await stream.add({b"h": b"x", b"b": b""}) for _ in range(4)]
    await stream.read("crashed", count=4, block_ms=100)
    # a restart under the same name sees its pending entries, paged by id
    first = await stream.read_pending("crashed", count=3)
    rest = await stream.read_pending("crashed", after=first[-1].entry_id, count=3)
    assert [e.entry_id for e in first + rest] == ids
    await stream.read("sibling", count=4, block_ms=100)  # nothing left for a live sibling
    await stream.add({b"h": b"y", b"b": b""})
    [_sibling] = await stream.read("sibling", count=4, block_ms=100)
    assert await stream.pending_consumers() == {"crashed": 4, "sibling": 1}
    assert await stream.claim_from("crashed", "other", min_idle_ms=60_000) == []  # not idle yet
    await asyncio.sleep(0.05)
    claimed = await stream.claim_from("crashed", "other", min_idle_ms=10, count=3)  # pages of 3
    assert [e.entry_id for e in claimed] == ids  # and never the sibling's entry
    assert await stream.pending_consumers() == {"other": 4, "sibling": 1}
    assert await stream.read_pending("crashed", count=10) == []
    await stream.aclose()


async def test_trimmed_entries_come_back_without_fields(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    entry = await stream.add({b"h": b"x", b"b": b""})
    await stream.read("c", count=1, block_ms=100)
    redis_server.client().xdel("s", entry)
    [pending] = await stream.read_pending("c", count=10)
    assert pending.entry_id == entry and pending.fields is None


async def test_survives_a_redis_restart(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await stream.add({b"h": b"before", b"b": b""})
    restart = asyncio.create_task(asyncio.to_thread(redis_server.restart, 0.5))
    await asyncio.sleep(0.2)
    await stream.add({b"h": b"during", b"b": b""})  # retried until Redis is back
    await restart
    got = await stream.read("c", count=10, block_ms=200)
    assert [e.fields[b"h"] for e in got if e.fields] == [b"before", b"during"]
    assert stream.reconnect_attempts > 0
    await stream.aclose()


async def test_lost_group_is_recreated(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    redis_server.client().flushall()  # a Redis without persistence restarted empty
    await stream.add({b"h": b"x", b"b": b""})
    assert len(await stream.read("c", count=10, block_ms=100)) == 1
    await stream.aclose()


async def test_gives_up_after_the_deadline(redis_server: RedisServer) -> None:
    stream = _stream(redis_server, give_up_after_s=0.3)
    await stream.ensure_group()
    redis_server.stop()
    with pytest.raises(RedisUnavailableError, match="unreachable for"):
        await stream.add({b"h": b"x", b"b": b""})
    await stream.aclose()


async def test_nothing_listening_at_startup_fails_in_seconds() -> None:
    """A wrong URL or a Redis not started is named at once, not retried for give_up_after_s."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    stream = SampleStream(url, stream="s", group="g", first_connect_s=1.0)
    started = time.monotonic()
    with pytest.raises(RedisUnavailableError) as e:
        await stream.ensure_group()
    assert time.monotonic() - started < 10
    message = str(e.value)
    assert f"redis at {url} unreachable since startup (XGROUP CREATE failed for 1s" in message
    assert f"Start it (e.g. `redis-server --port {port} " in message and "--redis-url" in message
    assert stream.reconnect_attempts > 1  # it did retry, for first_connect_s
    await stream.aclose()


async def test_once_connected_an_outage_longer_than_first_connect_is_waited_out(
    redis_server: RedisServer,
) -> None:
    stream = _stream(redis_server, first_connect_s=0.2)
    await stream.ensure_group()
    restart = asyncio.create_task(asyncio.to_thread(redis_server.restart, 1.5))
    await asyncio.sleep(0.2)
    await stream.add({b"h": b"during", b"b": b""})  # down 1.5 s > first_connect_s: retried
    await restart
    got = await stream.read("c", count=10, block_ms=200)
    assert [e.fields[b"h"] for e in got if e.fields] == [b"during"]
    assert stream.reconnect_attempts > 0
    await stream.aclose()


async def test_keyed_add_happens_once_even_when_the_reply_is_lost(
    redis_server: RedisServer,
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    script = stream._add_once_script
    lost = {"replies": 1}

    async def applied_then_reply_lost(**kwargs: object) -> object:
        result = await script(**kwargs)  # type: ignore[arg-type]
        if lost["replies"]:
            lost["replies"] -= 1
            raise RedisConnectionError("connection closed before the reply")
        return result

    stream._add_once_script = applied_then_reply_lost  # type: ignore[assignment]
    # Redis applied the first attempt; the retry finds the key and adds nothing.
    assert await stream.add({b"h": b"one", b"b": b""}, key="actor:0:0") is None
    assert stream.reconnect_attempts == 1
    assert await stream.add({b"h": b"one again", b"b": b""}, key="actor:0:0") is None
    assert await stream.add({b"h": b"two", b"b": b""}, key="actor:0:1") is not None
    got = await stream.read("c", count=10, block_ms=100)
    assert [e.fields[b"h"] for e in got if e.fields] == [b"one", b"two"]
    assert 0 < redis_server.client().ttl("s:added:actor:0:0") <= stream.dedupe_ttl_s
    await stream.aclose()


def test_dedupe_ttl_must_outlast_the_retries() -> None:
    with pytest.raises(ValueError, match="dedupe_ttl_s"):
        SampleStream("redis://127.0.0.1:1/0", give_up_after_s=600, dedupe_ttl_s=60)
