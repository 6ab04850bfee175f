"""`ludic actor` stamps a run id on every sample: the same for every actor started with the run's
flags (whatever its --actor-id, --seed or --server-url) and for a restarted one, another for an
actor started with other flags, whose samples the learner dead-letters."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.errors import LudicUsageError
from ludic.pipeline.commands import actor_run_id, run_actor
from ludic.pipeline.config import ActorConfig
from ludic.pipeline.run_check import RUN_KEY
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training import SAWBatch

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
__all__ = ["redis_server"]

KWARGS = {"opponent": "random"}


def _config(url: str = "redis://127.0.0.1:1/0", **changes: object) -> ActorConfig:
    base = ActorConfig(
        redis_url=url,
        stream="s",
        env="tictactoe",
        env_kwargs='{"opponent": "random"}',
        problems_per_batch=1,
        group_size=2,
        max_steps=1,
        max_tokens=6,
        batches=1,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_actors_of_one_run_share_its_id_and_other_flags_make_another_run() -> None:
    run = actor_run_id(_config(), KWARGS)
    assert run == actor_run_id(_config(), dict(KWARGS))  # a restart
    same_run = (
        {"actor_id": "actor-1"},
        {"seed": 7},
        {"concurrency": 2},
        {"batches": 9},
        {"max_backlog": 3},
        {"redis_url": "redis://10.0.0.1:6379/0"},
    )
    for changes in same_run:
        assert actor_run_id(_config(**changes), KWARGS) == run, changes
    other_runs = (
        {"env": "guess_number"},
        {"algorithm": "rloo"},
        {"temperature": 0.5},
        {"max_tokens": 7},
        {"group_size": 4},
        {"model": "/models/other"},
    )
    for changes in other_runs:
        assert actor_run_id(_config(**changes), KWARGS) != run, changes
    assert actor_run_id(_config(), {"opponent": "first_legal"}) != run


def test_an_actor_of_another_run_is_refused_on_a_stream_holding_the_old_runs_samples(
    redis_server: RedisServer,
) -> None:
    """A stream whose newest samples are another run's: a new learner would take that run and
    dead-letter this actor's samples, so the actor refuses before its first batch, naming both
    runs, the stream and the fixes; with --run-id of the old run it continues that run."""
    run_actor(_config(redis_server.url, actor_id="a"))
    old, new = actor_run_id(_config(), KWARGS), actor_run_id(_config(temperature=0.5), KWARGS)
    with pytest.raises(LudicUsageError) as refused:
        run_actor(_config(redis_server.url, actor_id="b", temperature=0.5))
    message = str(refused.value)
    assert f"stream 's' at {redis_server.url} holds 2 samples" in message
    assert f"from actor 'a') of run {old}" in message and f"('b') is run {new}" in message
    assert "--stream" in message and "DEL s`" in message and f"--run-id {old}" in message
    assert redis_server.client().xlen("s") == 2  # nothing pushed, no batch reserved
    assert redis_server.client().get("s:actor:b:batches") is None
    # the same flags changed on purpose, keeping the run's id: started, and trained as the run's
    run_actor(_config(redis_server.url, actor_id="c", temperature=0.5, run_id=old))

    async def read() -> SAWBatch:
        stream = SampleStream(redis_server.url, stream="s", group="g")
        source = PipelineBatchSource(stream, batch_size=4, block_ms=200, max_wait_s=1.0)
        try:
            return await source.next_batch()
        finally:
            await source.aclose()

    batch = asyncio.run(read())
    assert [i.meta["actor_id"] for i in batch.items] == ["a", "a", "c", "c"]
    assert {i.meta[RUN_KEY] for i in batch.items} == {old}
    assert batch.stats.get("pipeline/foreign_run", 0.0) == 0.0
    with pytest.raises(LudicUsageError, match="--run-id must be 1-128 printable ASCII"):
        run_actor(_config(run_id="my run"))  # refused before Redis (none at this URL)


def test_a_run_named_with_run_id_starts_on_an_old_runs_backlog(redis_server: RedisServer) -> None:
    # run B named on purpose: its learner (`ludic learner --run-id run-b`) dead-letters the
    # old backlog, so the actor is not refused for it
    run_actor(_config(redis_server.url, actor_id="a"))
    run_actor(_config(redis_server.url, actor_id="b", temperature=0.5, run_id="run-b"))
    entries = redis_server.client().xrange("s")
    assert len(entries) == 4


def test_a_stray_sample_of_another_run_does_not_refuse_the_runs_own_actor(
    redis_server: RedisServer,
) -> None:
    from dataclasses import replace

    from pipeline_fakes import sample

    from ludic.pipeline.codec import encode_sample

    run_actor(_config(redis_server.url, actor_id="a"))

    async def stray() -> None:
        stream = SampleStream(redis_server.url, stream="s", group="ludic-learners")
        item = sample()
        meta = {**item.meta, "actor_id": "stray", RUN_KEY: "run-stray"}
        await stream.add(encode_sample(replace(item, meta=meta), sample_id="stray:0:0"))
        await stream.aclose()

    asyncio.run(stray())
    run_actor(_config(redis_server.url, actor_id="a"))  # restarted with the same flags: its run
    assert redis_server.client().xlen("s") == 5
