"""`ludic learner --run-id`: the learner trains only the named run, dead-lettering every other
run's samples even where they come first on the stream (an old backlog), and a resumed learner
takes it over the run its checkpoint records, saying so. Real redis-server."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.errors import LudicUsageError
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.commands import run_learner
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.run_check import RUN_KEY
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]

OLD, NEW = "run-old", "run-new"


async def _push(stream: SampleStream, sample_id: str, run: str) -> None:
    item = sample()
    meta = {**item.meta, "actor_id": sample_id.split(":")[0], RUN_KEY: run}
    await stream.add(encode_sample(replace(item, meta=meta), sample_id=sample_id))


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", retry_cap_s=0.2)


async def test_the_named_run_is_trained_though_another_runs_backlog_comes_first(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    for sample_id, run in [("a:0:0", OLD), ("a:0:1", OLD), ("b:0:0", NEW), ("b:0:1", NEW)]:
        await _push(stream, sample_id, run)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        source = PipelineBatchSource(stream, batch_size=2, block_ms=100, run_id=NEW)
        batch = await source.next_batch()
    assert [i.meta["sample_id"] for i in batch.items] == ["b:0:0", "b:0:1"]
    assert batch.stats["pipeline/foreign_run"] == 2.0
    assert f"this learner trains run {NEW} (--run-id)" in caplog.text
    assert "as --run-id says" in caplog.text  # the foreign run's account names where NEW came from
    assert redis_server.client().xlen("s:dead") == 2
    await source.aclose()


async def test_a_resumed_learner_takes_the_named_run_over_its_checkpoints(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await _push(stream, "a:0:0", OLD)
    first = PipelineBatchSource(stream, batch_size=1, block_ms=100, lease_ttl_s=None)
    await first.next_batch()
    state = first.state_dict()
    assert state["run"]["id"] == OLD
    await first.ack_checkpointed()
    await first.aclose()
    stream = _stream(redis_server)
    for sample_id, run in [("a:1:0", OLD), ("b:0:0", NEW)]:
        await _push(stream, sample_id, run)
    resumed = PipelineBatchSource(stream, batch_size=1, block_ms=100, run_id=NEW)
    resumed.load_state_dict(state)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        batch = await resumed.next_batch()
    assert [i.meta["sample_id"] for i in batch.items] == ["b:0:0"]
    assert batch.stats["pipeline/foreign_run"] == 1.0
    assert f"trained run {OLD}; --run-id switches it to run {NEW}" in caplog.text
    assert resumed.state_dict()["run"]["id"] == NEW  # the checkpoints record it from now on
    await resumed.aclose()


def test_a_malformed_run_id_is_refused_before_redis() -> None:
    cfg = LearnerConfig(redis_url="redis://127.0.0.1:1/0", run_id="run one")
    with pytest.raises(LudicUsageError, match="--run-id must be 1-128 printable ASCII"):
        run_learner(cfg)
