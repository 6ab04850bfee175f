"""A source that is done with stops its lease-renewal thread: on `aclose()`, and when it is
dropped without one (the thread used to keep the lease alive, renewing it for as long as the
process lived and warning once its Redis was gone). Against a real redis-server."""

from __future__ import annotations

import gc
import threading

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.pipeline.lease import lease_key
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


async def _leased(
    server: RedisServer, consumer: str
) -> tuple[PipelineBatchSource, threading.Thread]:
    """A source holding its lease, and the renewal thread that holding it started."""
    stream = SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)
    source = PipelineBatchSource(stream, batch_size=1, consumer=consumer, lease_ttl_s=1.0)
    before = set(threading.enumerate())
    await source.hold_lease()
    [thread] = [
        t
        for t in threading.enumerate()
        if t not in before and t.name == f"lease-{source.consumer_name}"
    ]
    assert thread.is_alive()
    return source, thread


async def test_aclose_stops_the_renewal_thread_and_frees_the_name(
    redis_server: RedisServer,
) -> None:
    source, thread = await _leased(redis_server, "closed")
    await source.aclose()  # joins the thread before it returns
    assert not thread.is_alive()
    assert redis_server.client().get(lease_key("s", "g", "closed-r0")) is None


async def test_a_dropped_source_stops_its_renewal_thread_and_frees_the_name(
    redis_server: RedisServer,
) -> None:
    source, thread = await _leased(redis_server, "dropped")
    del source
    gc.collect()
    thread.join(timeout=10)  # wakes as soon as the thread ends; before the fix it never did
    assert not thread.is_alive(), "the lease thread of a dropped source is still renewing"
    assert redis_server.client().get(lease_key("s", "g", "dropped-r0")) is None
