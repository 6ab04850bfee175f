"""`ConsumerLease` on a real redis-server: a held lease refuses a second holder naming it, a
holder that stopped renewing (killed) is waited out, a lease taken over by another process is
reported lost (and the source then refuses to ack), a Redis restart is survived, a clean
release frees the name at once, and a live learner's entries are never claimed by another."""

from __future__ import annotations

import json
import logging
import time

import pytest
from pipeline_fakes import RedisServer, expire_leases, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.lease import ConsumerInUseError, ConsumerLease, ConsumerLeaseLostError
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training.batching.types import SAWBatch

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
__all__ = ["redis_server"]


def _lease(server: RedisServer, ttl_s: float = 1.0, **kwargs: float) -> ConsumerLease:
    return ConsumerLease(
        server.url, stream="s", group="g", consumer="learner-r0", ttl_s=ttl_s, **kwargs
    )


def test_a_held_lease_refuses_a_second_learner_naming_the_holder(
    redis_server: RedisServer,
) -> None:
    first = _lease(redis_server)
    first.acquire()
    try:
        second = _lease(redis_server, ttl_s=30.0)  # a ttl far past the holder's renewals
        with pytest.raises(ConsumerInUseError) as refused:
            second.acquire()  # refused once it sees the holder renew (every ttl/3), not at 30 s
        holder = json.loads(first.value)
        message = str(refused.value)
        assert "'learner-r0'" in message and f"pid {holder['pid']}" in message
        assert holder["host"] in message and "--consumer" in message and "stop the other" in message
        second.release()
    finally:
        first.release()
    third = _lease(redis_server, wait_s=0.0)
    third.acquire()  # released cleanly: free at once
    third.release()
    assert redis_server.client().get(first.key) is None


def test_a_killed_holders_lease_is_waited_out(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    killed = _lease(redis_server, ttl_s=1.0)
    killed.acquire()
    killed._stop.set()  # as after SIGKILL: no renewal, no release
    restarted = _lease(redis_server, ttl_s=3.0)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.lease"):
        restarted.acquire()
    assert "waiting up to 3s for the previous holder's lease" in caplog.text
    stored = json.loads(redis_server.client().get(restarted.key) or b"{}")
    assert stored["token"] == restarted.token
    restarted.release()


def test_a_killed_holder_with_a_longer_ttl_is_waited_out(redis_server: RedisServer) -> None:
    """Restarted with a shorter --lease-ttl-s than the killed run's: the restart waits for
    the old lease's own time to live (it was refused after its own, shorter, ttl)."""
    killed = json.dumps({"host": "h", "pid": 1, "token": "old"})
    redis_server.client().set("s:lease:g:learner-r0", killed, px=2_000)  # killed, ttl 2 s
    restarted = _lease(redis_server, ttl_s=0.5)
    restarted.acquire()
    stored = json.loads(redis_server.client().get(restarted.key) or b"{}")
    assert stored["token"] == restarted.token
    restarted.release()


def test_confirm_finds_a_lease_taken_between_two_heartbeats(redis_server: RedisServer) -> None:
    """The source confirms its lease right before each ack: a takeover the heartbeat has not
    seen yet (it renews every ttl/3) is caught there, not up to ttl/3 later."""
    lease = _lease(redis_server, ttl_s=60.0)  # the next heartbeat is 20 s away
    lease.acquire()
    other = json.dumps({"host": "elsewhere", "pid": 4242, "token": "theirs"})
    redis_server.client().set(lease.key, other, px=60_000)
    lease.check()  # the heartbeat has not looked yet
    with pytest.raises(ConsumerLeaseLostError, match="host elsewhere pid 4242"):
        lease.confirm()
    lease.release()
    assert json.loads(redis_server.client().get(lease.key) or b"{}")["token"] == "theirs"


def test_a_lease_survives_a_redis_restart(redis_server: RedisServer) -> None:
    lease = _lease(redis_server, ttl_s=1.0)
    lease.acquire()
    redis_server.restart(down_s=1.5)  # longer than the ttl: the key expired meanwhile
    time.sleep(1.0)  # a few renewals after Redis is back
    lease.check()  # not lost: nobody else took it, so it was taken again
    stored = json.loads(redis_server.client().get(lease.key) or b"{}")
    assert stored["token"] == lease.token
    lease.release()


async def test_a_lease_taken_by_another_stops_the_source_before_it_acks(
    redis_server: RedisServer,
) -> None:
    stream = SampleStream(redis_server.url, stream="s", group="g", ledger="s:ledger")
    await stream.ensure_group()
    for i in range(4):
        await stream.add(encode_sample(sample(), sample_id=f"id{i}"))
    source = PipelineBatchSource(stream, batch_size=2, ack="step", block_ms=100, lease_ttl_s=0.6)
    await source.next_batch()
    assert source._lease is not None
    other = json.dumps({"host": "elsewhere", "pid": 4242, "token": "theirs"})
    redis_server.client().set(source._lease.key, other, px=10_000)  # as if it expired and was taken
    with pytest.raises(ConsumerLeaseLostError, match="host elsewhere pid 4242"):
        await source.next_batch()
    assert redis_server.client().xlen("s:ledger") == 0  # nothing acked for the other learner
    assert redis_server.client().xpending("s", "g")["pending"] == 2
    await source.aclose()
    assert json.loads(redis_server.client().get("s:lease:g:learner-r0") or b"{}")["pid"] == 4242


async def test_a_live_learner_of_another_name_keeps_its_entries(redis_server: RedisServer) -> None:
    stream = SampleStream(redis_server.url, stream="s", group="g")
    await stream.ensure_group()
    for i in range(4):
        await stream.add(encode_sample(sample(), sample_id=f"id{i}"))
    other = PipelineBatchSource(stream, batch_size=2, consumer="other", block_ms=100)
    await other.next_batch()  # id0, id1: trained, acked at its next checkpoint
    fresh = SampleStream(redis_server.url, stream="s", group="g")
    mine = PipelineBatchSource(fresh, batch_size=2, claim_min_idle_ms=0, block_ms=100)
    assert _ids(await mine.next_batch()) == ["id2", "id3"]  # never the live one's
    await mine.commit()
    await mine.aclose()
    expire_leases(other)  # it died: its entries are taken over
    later = SampleStream(redis_server.url, stream="s", group="g")
    mine = PipelineBatchSource(later, batch_size=2, claim_min_idle_ms=0, block_ms=100)
    assert _ids(await mine.next_batch()) == ["id0", "id1"]
    await mine.aclose()
    await stream.aclose()


def _ids(batch: SAWBatch) -> list[str]:
    return [str(item.meta["sample_id"]) for item in batch.items]


def test_a_lease_released_while_waiting_never_takes_the_name(redis_server: RedisServer) -> None:
    """Ctrl-C while a restarted learner waits out a killed holder's lease: the waiting thread
    stops, and the name is not taken after the learner let go of it."""
    import threading

    killed = json.dumps({"host": "h", "pid": 1, "token": "old"})
    redis_server.client().set("s:lease:g:learner-r0", killed, px=1_500)
    waiting = _lease(redis_server, ttl_s=5.0)
    thread = threading.Thread(target=waiting.acquire)
    thread.start()
    time.sleep(0.3)
    waiting.release()  # as hold_lease does when its task is cancelled
    thread.join(timeout=5)
    assert not thread.is_alive()
    time.sleep(1.5)  # past the killed holder's expiry
    assert redis_server.client().get(waiting.key) is None
    assert waiting._thread is None
