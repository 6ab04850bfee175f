"""A commit acks entries and records them in the ledger together or not at all: a ledger key
that another program holds (WRONGTYPE) is refused before any ack (the acks were done and the
ledger lacked them), and a Redis past maxmemory still commits both (Redis refuses only a
script's first write, and the commit's is an XACK, which it never refuses)."""

from __future__ import annotations

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.errors import LudicUsageError
from ludic.pipeline.stream import SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
__all__ = ["redis_server"]


async def _read_two(server: RedisServer) -> tuple[SampleStream, list[tuple[str, str]]]:
    stream = SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)
    await stream.ensure_group()
    for i in range(2):
        await stream.add({b"x": b"y" * 1000}, key=f"id{i}")
    entries = await stream.read("c", count=2)
    return stream, [(e.entry_id, f"id{i}") for i, e in enumerate(entries)]


async def test_a_foreign_ledger_key_refuses_the_commit_before_any_ack(
    redis_server: RedisServer,
) -> None:
    stream, pairs = await _read_two(redis_server)
    redis_server.client().set("s:ledger", "another program's")
    with pytest.raises(LudicUsageError, match="key 's:ledger' holds a string"):
        await stream.commit(pairs, step=1, consumer="c")
    assert redis_server.client().xpending("s", "g")["pending"] == 2  # still to ack
    assert redis_server.client().xlen("s") == 2 and redis_server.client().hlen("s:acked:g") == 0
    await stream.aclose()


async def test_a_full_redis_commits_the_acks_and_their_ledger_record(
    redis_server: RedisServer,
) -> None:
    stream, pairs = await _read_two(redis_server)
    client = redis_server.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 200_000)
    with pytest.raises(Exception, match="maxmemory"):
        for i in range(1000):
            client.set(f"fill{i}", "z" * 10_000)
    assert await stream.commit(pairs, step=1, consumer="c") == 2
    [(_, fields)] = client.xrange("s:ledger")
    assert fields[b"ids"] == b'["id0","id1"]' and client.xpending("s", "g")["pending"] == 0
    client.config_set("maxmemory", 0)
    await stream.aclose()
