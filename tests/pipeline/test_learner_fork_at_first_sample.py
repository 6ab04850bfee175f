"""A fresh learner without --run-id on a reused stream (another run's `<stream>:published-version`
record) forked past the old run's versions at start, since it learns its run only from its first
sample. In one process it now decides at that sample, before its lag, and only then publishes
its start: a record of its own run (a killed learner's) is forked past, the dead versions'
samples dropped; another run's is replaced by that publish, its versions numbered from 0 (so
the servers never go back below the record while its run is unknown). Under torchrun, where each
rank pins its run at its own first sample, the ranks still fork at start
(`test_learner_version_record_run`). A real redis-server; the trainer is a stand-in."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.pipeline.codec import encode_sample
from ludic.pipeline.learner_run import fork_versions
from ludic.pipeline.run_check import RUN_KEY
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.versions import (
    PublishedRecord,
    RecordingPublisher,
    published_key,
    published_record,
)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
__all__ = ["redis_server"]


async def _fresh_learner(
    server: RedisServer, recorded_run: str, run: str, versions: tuple[int, ...]
) -> tuple[SimpleNamespace, PipelineBatchSource]:
    """A fresh learner (no --run-id) on stream `s`, whose record says run `recorded_run`
    published up to version 4, and one sample per version in `versions` stamped `run`."""
    server.client().set(published_key("s"), json.dumps({"version": 4, "run": recorded_run}))
    stream = SampleStream(server.url, stream="s")
    await stream.ensure_group()
    for i, version in enumerate(versions):
        item = sample(versions=(version,))
        item = replace(item, meta={**item.meta, RUN_KEY: run, "actor_id": "a"})
        await stream.add(encode_sample(item, sample_id=f"id{i}"))
    trainer = SimpleNamespace(policy_version=0, step=0, published=[])
    trainer.publish_weights = lambda: trainer.published.append(trainer.policy_version)
    source = PipelineBatchSource(
        stream,
        batch_size=2,
        current_version=lambda: trainer.policy_version,
        block_ms=50,
        max_wait_s=1.0,
    )
    return trainer, source


class _Pushes:
    def publish(self, weights: object, *, version: int) -> None:
        pass


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


async def test_its_own_runs_record_is_forked_past_at_the_first_sample(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, source = await _fresh_learner(redis_server, "run-a", "run-a", (3, 0, 0))
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        fork_versions(trainer, source, redis_server.url)
        assert trainer.policy_version == 0 and _warnings(caplog) == []  # not decided yet
        assert source.on_first_sample is not None  # `_train` leaves its start publish to it
        batch = await source.next_batch()
    assert trainer.policy_version == 5 and source.staleness.forks.dead(3) == (0, 5)
    assert trainer.published == [5]  # above the record's 4: the servers never go back
    assert [item.policy_versions for item in batch.items] == [(0,), (0,)]  # its start: lag 0
    assert batch.stats["pipeline/dead_branch"] == 1.0  # version 3, the first sample read
    assert batch.stats["pipeline/lag_max"] == 0.0
    fork_line = next(w for w in _warnings(caplog) if w.startswith("a learner before this one"))
    assert "numbers its weights 5 on (published now)" in fork_line
    assert "the record names run" not in fork_line  # compared: nothing left unknown
    await source.aclose()


async def test_another_runs_record_is_not_forked_past(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, source = await _fresh_learner(redis_server, "run-old", "run-new", (0, 1))
    publisher = RecordingPublisher(
        _Pushes(), url=redis_server.url, stream="s", run=lambda: source.run_check.run
    )
    publish = trainer.publish_weights
    trainer.publish_weights = lambda: (publish(), publisher.publish({}, version=0))
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        fork_versions(trainer, source, redis_server.url)
        batch = await source.next_batch()
    publisher.close()
    assert trainer.policy_version == 0 and source.staleness.forks.forks == []
    assert trainer.published == [0]  # its start, as run-new: the record is replaced
    assert published_record(redis_server.url, "s") == PublishedRecord(0, "run-new")
    assert len(batch.items) == 2 and "pipeline/dead_branch" not in batch.stats
    (line,) = [w for w in _warnings(caplog) if "stream 's' records" in w]
    assert "published by a learner of run run-old, not this learner's run run-new" in line
    await source.aclose()
