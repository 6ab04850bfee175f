"""A Redis past its maxmemory refuses the actor's pushes: the actor stops with one line naming
Redis, the limit and the fixes, not a redis-py traceback. A Redis that evicts keys when full
(maxmemory-policy other than noeviction) could drop the stream without a word, so the actor and
the learner warn at startup. Real redis-server."""

from __future__ import annotations

import logging

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.errors import is_refusal
from ludic.pipeline.redis_memory import RedisFullError
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.stream_push import push_within
from ludic.pipeline.stream_url import check_reachable

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]

PAYLOAD = {b"h": b"x" * 50_000}


async def test_a_full_redis_is_named_with_its_limit_and_the_fix(redis_server: RedisServer) -> None:
    client = redis_server.client()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used + 400_000)  # noeviction: the default policy
    stream = SampleStream(redis_server.url, stream="s", group="g", retry_cap_s=0.2)
    await stream.ensure_group()
    with pytest.raises(RedisFullError) as full:
        for i in range(100):  # ~5 MB: far past the limit
            await stream.add(PAYLOAD, key=f"a:0:{i}")
    message = str(full.value)
    assert f"redis at {redis_server.url} is full: it refused XADD once" in message
    assert "CONFIG SET maxmemory" in message and "--max-backlog" in message
    assert is_refusal(full.value)  # `ludic actor: error: ...`, no traceback
    client.config_set("maxmemory", 1)  # whatever the refusal freed: every write is past it
    with pytest.raises(RedisFullError, match="it refused XADD batch"):  # the actor's push
        await push_within(stream, [("b:0:0", PAYLOAD)], max_backlog=1000)
    client.config_set("maxmemory", 0)
    await stream.aclose()


def test_an_evicting_redis_is_warned_about_at_startup(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis_server.client()
    client.config_set("maxmemory", 100_000_000)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        check_reachable(redis_server.url)  # noeviction: nothing to say
        assert not caplog.records
        client.config_set("maxmemory-policy", "allkeys-lru")
        check_reachable(redis_server.url)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "(maxmemory-policy allkeys-lru)" in warning and "drop the sample stream" in warning
    assert "CONFIG SET maxmemory-policy noeviction" in warning
