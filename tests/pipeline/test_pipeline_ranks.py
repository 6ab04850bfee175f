"""PipelineBatchSource with several data-parallel learner ranks against a real redis-server:
disjoint shares, exactly once with checkpoints across a crash of every rank, a live sibling's
entries never taken, an earlier run's extra ranks taken over, world-size changes."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
from pipeline_fakes import RedisServer, expire_leases, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import BatchSourceExhausted
from ludic.types import JSON

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _source(server: RedisServer, rank: int, world: int, **kwargs: object) -> PipelineBatchSource:
    stream = SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)
    options: dict = {"batch_size": 3, "block_ms": 50, "max_wait_s": 0.3, **kwargs}  # type: ignore[type-arg]
    return PipelineBatchSource(stream, rank=rank, world_size=world, **options)


MakeSource = Callable[..., PipelineBatchSource]


@pytest.fixture
async def make_source(redis_server: RedisServer) -> AsyncIterator[MakeSource]:
    """`_source` on this test's server; every source made is closed after the test (while the
    server still runs), so no lease thread outlives it to renew against a stopped server."""
    made: list[PipelineBatchSource] = []

    def make(rank: int, world: int, **kwargs: object) -> PipelineBatchSource:
        made.append(_source(redis_server, rank, world, **kwargs))
        return made[-1]

    yield make
    for source in made:
        await source.aclose()


async def _push(server: RedisServer, n: int, start: int = 0) -> None:
    stream = SampleStream(server.url, stream="s", group="g")
    await stream.ensure_group()
    for i in range(start, start + n):
        await stream.add(encode_sample(sample(), sample_id=f"id{i}"), key=f"id{i}")
    await stream.aclose()


async def _step(ranks: list[PipelineBatchSource]) -> list[list[str]]:
    """One data-parallel step: every rank pulls its batch (the ids it trains on)."""
    batches = [await r.next_batch() for r in ranks]
    return [[item.meta["sample_id"] for item in b.items] for b in batches]


def _ledger(server: RedisServer) -> list[tuple[str, str]]:
    """(consumer, sample id) for every ack."""
    raw = server.client().xrange("s:ledger")
    return [(f[b"consumer"].decode(), i) for _, f in raw for i in json.loads(f[b"ids"])]


async def _drain(ranks: list[PipelineBatchSource]) -> list[list[str]]:
    """Steps until every rank times out empty (the learner's stopping rule)."""
    trained: list[list[str]] = [[] for _ in ranks]
    while True:
        try:
            step = await _step(ranks)
        except BatchSourceExhausted:  # a single rank raises instead
            return trained
        for rank, ids in enumerate(step):
            trained[rank] += ids
        if all(r.timed_out for r in ranks):
            return trained


async def test_ranks_read_disjoint_shares_and_ack_under_their_own_names(
    redis_server: RedisServer, make_source: MakeSource
) -> None:
    await _push(redis_server, 12)
    ranks = [make_source(r, 2) for r in range(2)]
    assert [r.consumer_name for r in ranks] == ["learner-r0", "learner-r1"]
    trained = await _drain(ranks)
    assert not set(trained[0]) & set(trained[1]) and trained[0] and trained[1]
    assert sorted(trained[0] + trained[1]) == sorted(f"id{i}" for i in range(12))
    for r in ranks:
        r.state_dict()
        await r.ack_checkpointed()
    ledger = _ledger(redis_server)
    assert sorted(i for _, i in ledger) == sorted(f"id{i}" for i in range(12))
    assert {i for c, i in ledger if c == "learner-r1"} == set(trained[1])


async def test_exactly_once_with_checkpoints_when_every_rank_crashes(
    redis_server: RedisServer, make_source: MakeSource
) -> None:
    await _push(redis_server, 30)
    ranks = [make_source(r, 2) for r in range(2)]
    before = [ids for step in [await _step(ranks), await _step(ranks)] for ids in step]
    states: list[JSON] = [r.state_dict() for r in ranks]  # checkpoint after step 2
    await _step(ranks)  # step 3 starts (acks the checkpoint's entries) and trains on more
    await _step(ranks)  # step 4: trained, in no checkpoint; then both ranks are killed
    killed_acks = len(_ledger(redis_server))
    assert killed_acks == 12
    expire_leases(*ranks)
    resumed = [make_source(r, 2) for r in range(2)]
    for r, state in zip(resumed, states, strict=True):
        r.load_state_dict(state)
    after = await _drain(resumed)
    # the model is the checkpoint's (steps 1-2) plus what the resumed ranks trained
    effective = Counter(i for ids in before + after for i in ids)
    assert effective == Counter(f"id{i}" for i in range(30))
    assert resumed[0].totals["redelivered"] > 0 and resumed[1].totals["redelivered"] > 0
    for r in resumed:
        r.state_dict()
        await r.ack_checkpointed()
    assert Counter(i for _, i in _ledger(redis_server)) == effective


async def test_a_restarting_rank_never_takes_a_live_siblings_entries(
    redis_server: RedisServer, make_source: MakeSource
) -> None:
    await _push(redis_server, 6)
    sibling = make_source(1, 2)
    mine = await _step([sibling])  # rank 1 holds 3 entries, trained, not yet checkpointed
    await asyncio.sleep(0.05)
    restarted = make_source(0, 2, claim_min_idle_ms=0)
    theirs = await _drain([restarted])
    assert sorted(mine[0] + theirs[0]) == sorted(f"id{i}" for i in range(6))
    assert not set(mine[0]) & set(theirs[0])


async def test_an_earlier_runs_extra_rank_is_taken_over_at_once(
    redis_server: RedisServer, make_source: MakeSource
) -> None:
    await _push(redis_server, 6)
    old = [make_source(r, 3, batch_size=2) for r in range(3)]
    read = await _step(old)  # then the 3-rank run dies before any checkpoint
    expire_leases(*old)
    fresh = [make_source(r, 2, batch_size=2) for r in range(2)]
    trained = await _drain(fresh)
    assert Counter(trained[0] + trained[1]) == Counter(f"id{i}" for i in range(6))
    assert set(read[2]) <= set(trained[0])  # rank 0 took the old rank 2's entries


async def test_a_world_size_change_is_refused_until_the_checkpoint_is_acked(
    redis_server: RedisServer, make_source: MakeSource
) -> None:
    await _push(redis_server, 12)
    ranks = [make_source(r, 2, batch_size=2) for r in range(2)]
    await _step(ranks)
    states = [r.state_dict() for r in ranks]  # checkpoint at step 1, then the run dies
    expire_leases(*ranks)
    one = make_source(0, 1, batch_size=2)
    one.load_state_dict(states[0])  # another world size: every rank gets rank 0's state
    with pytest.raises(RuntimeError, match="Resume once with 2 ranks"):
        await one.next_batch()
    expire_leases(one)
    again = [make_source(r, 2, batch_size=2) for r in range(2)]
    for r, state in zip(again, states, strict=True):
        r.load_state_dict(state)
    await _step(again)  # the 2-rank resume acks the checkpoint's entries on each rank
    later = [r.state_dict() for r in again]  # checkpoint at step 2
    await _step(again)  # step 3 acks it, trains on more, and the run dies again
    expire_leases(*again)
    now_one = make_source(0, 1, batch_size=2)
    now_one.load_state_dict(later[0])
    [rest] = await _drain([now_one])  # old rank 1's unacked entries are taken over
    trained = [i for s in states + later for _, i in s["trained"]]
    assert Counter(trained + rest) == Counter(f"id{i}" for i in range(12))


async def test_single_rank_refusals_and_warnings(
    redis_server: RedisServer, make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    other = make_source(0, 1, consumer="other")
    with pytest.raises(ValueError, match="resume with --consumer other"):
        make_source(0, 1).load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="not a pipeline source's"):
        make_source(0, 1).load_state_dict({"epoch": 3})  # another source's position
    with pytest.raises(ValueError, match="rank must be in"):
        make_source(2, 2)
    with pytest.raises(ValueError, match="ack must be"):
        make_source(0, 1, ack="never")
    await _push(redis_server, 4)
    source = make_source(0, 1, batch_size=2, warn_unacked=4)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        await _step([source])
        await _step([source])
        assert not caplog.records
        with pytest.raises(BatchSourceExhausted):  # one rank: nothing left is an error
            await source.next_batch()
    assert "4 samples trained since the last checkpoint are not acknowledged" in caplog.text
