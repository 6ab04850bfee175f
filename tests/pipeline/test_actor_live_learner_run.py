"""A live learner publishes the run it trains, so an actor of another run is refused while that
learner lives, also once the learner has drained the stream (no sample left for the actor's
backlog check to read), and starts once the learner is gone."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.errors import LudicUsageError
from ludic.pipeline.commands import actor_run_id, run_actor
from ludic.pipeline.config import ActorConfig
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]
__all__ = ["redis_server"]

KWARGS = {"opponent": "random"}


def _config(url: str, **changes: object) -> ActorConfig:
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


def test_an_actor_of_another_run_is_refused_while_a_learner_of_a_drained_stream_lives(
    redis_server: RedisServer,
) -> None:
    run_a = actor_run_id(_config(redis_server.url), KWARGS)
    run_b = actor_run_id(_config(redis_server.url, temperature=0.5), KWARGS)
    run_actor(_config(redis_server.url, actor_id="a"))
    loop = asyncio.new_event_loop()  # the learner stays open while the actors run theirs
    stream = SampleStream(redis_server.url, stream="s")
    source = PipelineBatchSource(stream, batch_size=2, ack="step", block_ms=200, max_wait_s=5.0)
    try:
        loop.run_until_complete(source.next_batch())  # pins run A
        loop.run_until_complete(source.commit())
        assert redis_server.client().xlen("s") == 0  # drained: no sample names run A
        # flags of another run, or another --run-id (which skips only the backlog check)
        for changes, run in (({}, run_b), ({"run_id": "run-new"}, "run-new")):
            with pytest.raises(LudicUsageError) as refused:
                run_actor(_config(redis_server.url, actor_id="b", temperature=0.5, **changes))
            message = str(refused.value)
            assert "is read by a live learner (host " in message
            assert f"trains run {run_a}, but this actor ('b') is run {run}:" in message
            assert f"pass --run-id {run_a}" in message and "--stream" in message
            assert f"stop that learner first (then `ludic learner --run-id {run}`" in message
            assert "until its lease expires, one --lease-ttl-s after" in message
        assert redis_server.client().xlen("s") == 0  # nothing pushed
        run_actor(_config(redis_server.url, actor_id="c"))  # run A's own actor starts
        assert redis_server.client().xlen("s") == 2
    finally:
        loop.run_until_complete(source.aclose())
        loop.close()
    assert redis_server.client().get("s:learner-run") is None  # released with the lease
    # no learner: run B named on purpose starts (its learner dead-letters run A's backlog)
    run_actor(_config(redis_server.url, actor_id="b", temperature=0.5, run_id=run_b))
    assert redis_server.client().xlen("s") == 4
