"""PipelineBatchSource against a real redis-server: batches, acks once a checkpoint holds them
(or after each step), stale samples dropped or down-weighted with counts, crash recovery,
checkpoint hand-off, bad input."""

from __future__ import annotations

import asyncio

import pytest
import redis
from pipeline_fakes import RedisServer, expire_leases, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import BatchSource, BatchSourceExhausted, StatefulBatchSource

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)


async def _push(
    stream: SampleStream, n: int, *, start: int = 0, versions: tuple[int, ...] = ()
) -> None:
    for i in range(start, start + n):
        await stream.add(encode_sample(sample(versions=versions), sample_id=f"id{i}"))


def _ids(batch_items: list) -> list[str]:  # type: ignore[type-arg]
    return [item.meta["sample_id"] for item in batch_items]


def _ledger(server: RedisServer) -> list[str]:
    import json

    return [i for _, f in server.client().xrange("s:ledger") for i in json.loads(f[b"ids"])]


async def test_by_default_only_checkpointed_entries_are_acked(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    source = PipelineBatchSource(stream, batch_size=2, block_ms=100)
    await _push(stream, 6)
    await source.next_batch()
    await source.next_batch()
    assert _ledger(redis_server) == []  # trained, but no checkpoint holds them yet
    state = source.state_dict()  # the Trainer checkpoints after step 2
    assert [pair[1] for pair in state["trained"]] == ["id0", "id1", "id2", "id3"]
    assert _ledger(redis_server) == []  # the checkpoint is not written yet
    await source.next_batch()  # the next step starts: the checkpoint is on disk
    assert _ledger(redis_server) == ["id0", "id1", "id2", "id3"]
    assert redis_server.client().hget("s:acked:g", "learner-r0") == b"2"
    assert await source.ack_checkpointed() == 0  # id4, id5 are in no checkpoint
    assert _ledger(redis_server) == ["id0", "id1", "id2", "id3"]
    await source.aclose()


async def test_batches_in_order_and_commit_after_the_next_pull(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    source = PipelineBatchSource(stream, batch_size=3, block_ms=100, ack="step")
    assert isinstance(source, BatchSource) and isinstance(source, StatefulBatchSource)
    await _push(stream, 6)
    first = await source.next_batch()
    assert _ids(first.items) == ["id0", "id1", "id2"]
    assert first.stats["pipeline/samples"] == 3.0
    assert _ledger(redis_server) == []  # the step that uses them has not finished
    second = await source.next_batch()  # pulling again means the first step is done
    assert _ids(second.items) == ["id3", "id4", "id5"]
    assert _ledger(redis_server) == ["id0", "id1", "id2"]
    assert await source.commit() == 3
    assert _ledger(redis_server) == [f"id{i}" for i in range(6)]
    assert redis_server.client().xlen("s") == 0
    await source.aclose()


async def test_stale_samples_are_dropped_and_counted(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    version = {"now": 5}
    source = PipelineBatchSource(
        stream,
        batch_size=2,
        max_lag=2,
        current_version=lambda: version["now"],
        block_ms=100,
        max_wait_s=0.3,
    )
    await _push(stream, 1, start=0, versions=(2,))  # lag 3 > 2: stale
    await _push(stream, 1, start=1, versions=(3, 4))  # oldest token lag 2: fresh
    await _push(stream, 1, start=2, versions=(5,))
    await _push(stream, 1, start=3, versions=())  # no versions recorded: never stale
    batch = await source.next_batch()
    assert _ids(batch.items) == ["id1", "id2"]
    assert batch.stats["pipeline/dropped_stale"] == 1.0
    # the lag metrics describe the trained samples (lags 2 and 0), not the dropped one (lag 3)
    assert batch.stats["pipeline/lag_max"] == 2.0 and batch.stats["pipeline/lag_mean"] == 1.0
    batch = await source.next_batch()  # only one sample left: a partial batch after max_wait_s
    assert _ids(batch.items) == ["id3"] and "pipeline/lag_max" not in batch.stats
    await source.commit()
    assert sorted(_ledger(redis_server)) == ["id0", "id1", "id2", "id3"]  # dropped = consumed
    assert source.totals["dropped_stale"] == 1


async def test_stale_samples_can_be_downweighted(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    source = PipelineBatchSource(
        stream,
        batch_size=2,
        max_lag=1,
        stale="downweight",
        stale_decay=0.5,
        current_version=lambda: 4,
        block_ms=100,
    )
    await _push(stream, 1, start=0, versions=(1,))  # lag 3: 2 beyond max_lag -> x 0.25
    await _push(stream, 1, start=1, versions=(3,))  # lag 1: untouched
    batch = await source.next_batch()
    assert [item.weight for item in batch.items] == [0.25, 1.0]
    assert batch.items[0].meta["stale_weight_factor"] == 0.25
    assert batch.stats["pipeline/downweighted"] == 1.0
    assert batch.stats["pipeline/lag_max"] == 3.0  # downweighted samples are trained


async def test_a_restarted_learner_replays_exactly_the_uncommitted(
    redis_server: RedisServer,
) -> None:
    stream = _stream(redis_server)
    await _push(stream, 6)
    crashed = PipelineBatchSource(stream, batch_size=2, ack="step", block_ms=100)
    await crashed.next_batch()
    await crashed.next_batch()  # commits id0, id1; id2, id3 were read then the process died
    expire_leases(crashed)
    restarted = PipelineBatchSource(_stream(redis_server), batch_size=3, ack="step")
    batch = await restarted.next_batch()
    assert _ids(batch.items) == ["id2", "id3", "id4"]  # replayed first, then new ones
    assert restarted.totals["redelivered"] == 2
    await restarted.commit()
    assert _ledger(redis_server) == ["id0", "id1", "id2", "id3", "id4"]


async def test_entries_of_a_dead_consumer_are_claimed(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await _push(stream, 2)
    dead = PipelineBatchSource(stream, batch_size=2, consumer="old-name", block_ms=100)
    await dead.next_batch()
    expire_leases(dead)
    await asyncio.sleep(0.05)
    new = PipelineBatchSource(
        _stream(redis_server), batch_size=2, consumer="new-name", claim_min_idle_ms=10
    )
    assert _ids((await new.next_batch()).items) == ["id0", "id1"]


async def test_checkpointed_entries_are_acked_on_resume(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await _push(stream, 4)
    source = PipelineBatchSource(stream, batch_size=2, block_ms=100)
    await source.next_batch()
    state = source.state_dict()  # saved in a checkpoint after the step on id0, id1
    assert [pair[1] for pair in state["trained"]] == ["id0", "id1"]
    # crash before the ack; the resumed learner loads the checkpoint's state
    expire_leases(source)
    resumed = PipelineBatchSource(_stream(redis_server), batch_size=2)
    resumed.load_state_dict(state)
    batch = await resumed.next_batch()
    assert _ids(batch.items) == ["id2", "id3"]  # id0, id1 are in the checkpoint: not redone
    assert _ledger(redis_server) == ["id0", "id1"]


async def test_bad_entries_are_dead_lettered_and_duplicates_skipped(
    redis_server: RedisServer,
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await _push(stream, 1, start=0)
    await stream.add({b"h": b"garbage", b"b": b""})
    await _push(stream, 1, start=0)  # the same sample id again (an XADD retried by an actor)
    await _push(stream, 1, start=1)
    source = PipelineBatchSource(stream, batch_size=2, block_ms=100)
    batch = await source.next_batch()
    assert _ids(batch.items) == ["id0", "id1"]
    assert batch.stats["pipeline/invalid"] == 1.0 and batch.stats["pipeline/duplicates"] == 1.0
    [dead] = redis_server.client().xrange("s:dead")
    assert b"header is not msgpack" in dead[1][b"error"] and dead[1][b"h"] == b"garbage"
    await source.commit()
    assert redis_server.client().xlen("s") == 0  # nothing is left to be redelivered forever
    ledger = _ledger(redis_server)
    assert [i for i in ledger if ":" not in i] == ["id0", "id1"]  # each trained sample once
    assert "duplicate:id0" in ledger and any(i.startswith("invalid:") for i in ledger)


async def test_max_wait_returns_a_partial_batch_then_stops(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await _push(stream, 1)
    source = PipelineBatchSource(stream, batch_size=4, block_ms=50, max_wait_s=0.2)
    assert len((await source.next_batch()).items) == 1
    with pytest.raises(BatchSourceExhausted, match="no samples arrived"):
        await source.next_batch()


def test_invalid_settings_are_refused(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    with pytest.raises(ValueError, match="batch_size"):
        PipelineBatchSource(stream, batch_size=0)
    with pytest.raises(ValueError, match="current_version"):
        PipelineBatchSource(stream, batch_size=1, max_lag=1)
    with pytest.raises(ValueError, match="stale must be"):
        PipelineBatchSource(stream, batch_size=1, stale="keep")  # type: ignore[arg-type]


async def test_a_read_whose_reply_was_lost_is_taken_back(redis_server: RedisServer) -> None:
    # Redis served an XREADGROUP (the entries moved to this consumer's pending list) and the
    # connection dropped before the reply arrived: a retried `>` read never returns them again.
    stream = _stream(redis_server)
    source = PipelineBatchSource(stream, batch_size=4, block_ms=100, max_wait_s=0.5)
    await _push(stream, 8)
    first = await source.next_batch()
    real_read = stream.redis.xreadgroup
    calls = {"n": 0}

    async def read_then_drop(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        reply = await real_read(*args, **kwargs)  # type: ignore[arg-type]
        if calls["n"] == 1:
            raise redis.ConnectionError("Connection closed by server.")
        return reply

    stream.redis.xreadgroup = read_then_drop  # type: ignore[method-assign]
    second = await source.next_batch()
    await _push(stream, 2, start=8)
    third = await source.next_batch()
    await source.commit()
    ids = _ids(first.items) + _ids(second.items) + _ids(third.items)
    assert sorted(ids, key=lambda i: int(i[2:])) == [f"id{i}" for i in range(10)]
    assert source.totals["redelivered"] == 4 and source.totals["duplicates"] == 0
    assert sorted(_ledger(redis_server)) == sorted(ids)
    await source.aclose()
