"""Policy versions never repeat across a learner's restarts: a learner resumed at version 3 after
a killed one published 4 and 5 numbers its weights 6 on, drops (counted, said once) the samples
of the dead versions 4 and 5, which would otherwise read as newer than it or, once it reached 5
again, as fresh, and counts lags along its own branch only (the checkpoint's version-3 samples
are of the weights it trains on, lag 0)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.models import load_model, tiny_model_dir
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.config import LearnerConfig
from ludic.pipeline.learner_report import done_line
from ludic.pipeline.learner_run import fork_versions
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.pipeline.versions import (
    PublishedRecord,
    RecordingPublisher,
    dead_span,
    published_key,
)
from ludic.training.batching.types import BatchSourceExhausted

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
__all__ = ["redis_server"]


class _Pushes:
    def __init__(self, server: RedisServer) -> None:
        self.server, self.recorded = server, []

    def publish(self, weights: object, *, version: int) -> None:
        record = PublishedRecord.parse(self.server.client().get(published_key("s")))
        self.recorded.append(record.version)


def test_the_publisher_records_the_highest_version_before_each_push(
    redis_server: RedisServer,
) -> None:
    inner = _Pushes(redis_server)
    publisher = RecordingPublisher(inner, url=redis_server.url, stream="s")
    for version in (0, 5, 3):  # a resumed learner republishes an older version
        publisher.publish({}, version=version)
    publisher.close()
    assert inner.recorded == [0, 5, 5]  # set before each push; never lowered


async def test_a_resumed_learner_forks_past_a_dead_learners_versions(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    redis_server.client().set(published_key("s"), 5)  # the dead learner reached version 5
    stream = SampleStream(redis_server.url, stream="s")
    await stream.ensure_group()
    for i, version in enumerate((3, 4, 5, 5, 6)):
        await stream.add(encode_sample(sample(versions=(version,)), sample_id=f"id{i}"))
    published: list[int] = []
    trainer = SimpleNamespace(policy_version=3, step=3)  # resumed from its checkpoint
    trainer.publish_weights = lambda: published.append(trainer.policy_version)
    source = PipelineBatchSource(
        stream,
        batch_size=2,
        max_lag=0,  # only samples of the weights the learner holds
        current_version=lambda: trainer.policy_version,
        block_ms=50,
        max_wait_s=1.0,
    )
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        fork_versions(trainer, source, redis_server.url)
        batch = await source.next_batch()
    assert trainer.policy_version == 6 and published == [6]  # republished under its new number
    assert [i.policy_versions for i in batch.items] == [(3,), (6,)]  # same weights: lag 0
    assert batch.stats["pipeline/dead_branch"] == 3.0  # 4, 5, 5
    assert batch.stats["pipeline/lag_max"] == 0.0 and "pipeline/ahead" not in batch.stats
    dead = [r.getMessage() for r in caplog.records if "pipeline/dead_branch" in r.getMessage()]
    assert len(dead) == 1 and "every sample of versions 4..5 are dropped" in dead[0]
    state = source.state_dict()
    await source.aclose()
    # a checkpoint keeps the fork: the learner resumed from it still drops the dead versions
    resumed = PipelineBatchSource(
        SampleStream(redis_server.url, stream="s"), batch_size=1, current_version=lambda: 7
    )
    resumed.load_state_dict(state)
    assert resumed.staleness.forks.dead(4) == (3, 6) and resumed.staleness.forks.dead(6) is None
    await resumed.stream.aclose()


async def test_no_fork_where_no_version_past_the_checkpoints_was_published(
    redis_server: RedisServer,
) -> None:
    redis_server.client().set(published_key("s"), 3)
    trainer = SimpleNamespace(policy_version=3, step=3, publish_weights=lambda: None)
    source = PipelineBatchSource(SampleStream(redis_server.url, stream="s"), batch_size=1)
    fork_versions(trainer, source, redis_server.url)
    assert trainer.policy_version == 3 and source.staleness.forks.forks == []
    await source.stream.aclose()


async def test_a_fresh_learner_forks_too_and_publishes_before_its_first_step(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A learner killed before its first checkpoint published 1..4: its successor starts at
    version 0 again and would reach 1..4 with other weights (review finding 1)."""
    from ludic.pipeline import learner_run

    redis_server.client().set(published_key("s"), 4)
    source = PipelineBatchSource(SampleStream(redis_server.url, stream="s"), batch_size=1)
    calls: list[int] = []
    trainer = SimpleNamespace(policy_version=0, step=0, publish_weights=lambda: calls.append(0))
    fork_versions(trainer, source, redis_server.url)
    assert trainer.policy_version == 5 and calls == []  # `_train` publishes before step 1
    assert source.staleness.forks.dead(3) == (0, 5) and source.staleness.forks.dead(0) is None

    forked: list[int] = []
    monkeypatch.setattr(learner_run, "fork_versions", lambda t, s, u: forked.append(t.step))
    model, tokenizer = load_model(tiny_model_dir(cache_dir=tmp_path))
    cfg = LearnerConfig(redis_url=redis_server.url, stream="s", out_dir=tmp_path / "out")
    learner_run._trainer(cfg, source, model, tokenizer, None).close()
    assert forked == [0]  # no checkpoint to resume: the fresh learner is forked as well
    await source.stream.aclose()


def test_the_closing_line_counts_a_dead_learners_samples_as_untrained() -> None:
    trainer = SimpleNamespace(step=0, checkpoints=None)
    line = done_line(trainer, {"samples": 10, "dead_branch": 3, "dropped_stale": 1})
    assert "10 samples read, 6 of them trained, 1 dropped as stale (more than --max-lag" in line
    assert ", 3 dropped as a killed learner's (versions past this one's start)" in line
    assert dead_span(2, 4) == "version 3" and dead_span(3, 6) == "versions 4..5"


def test_the_record_waits_out_a_redis_restart_before_the_push(redis_server: RedisServer) -> None:
    inner = _Pushes(redis_server)
    publisher = RecordingPublisher(inner, url=redis_server.url, stream="s")
    redis_server.stop()
    back = threading.Timer(1.0, redis_server.start)
    back.start()
    try:
        publisher.publish({}, version=2)  # raised ConnectionError: the learner stopped
    finally:
        back.join()
    publisher.close()
    assert inner.recorded == [2]


async def test_a_wait_that_read_only_dead_versions_says_so(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Only samples of a killed learner's versions arrived: the closing line said "no samples
    arrived" and the waiting line blamed slow actors (review finding 3)."""
    stream = SampleStream(redis_server.url, stream="s")
    await stream.ensure_group()
    for i in range(4):
        await stream.add(encode_sample(sample(versions=(4,)), sample_id=f"id{i}"))
    source = PipelineBatchSource(
        stream, batch_size=2, current_version=lambda: 6, block_ms=50, max_wait_s=0.5
    )
    source.wait_notice_s = 0.0  # the waiting line on every read
    source.staleness.forks.add(3, 6)
    with (
        caplog.at_level(logging.WARNING, logger="ludic.pipeline"),
        pytest.raises(BatchSourceExhausted) as stopped,
    ):
        await source.next_batch()
    await source.aclose()
    said = str(stopped.value)
    assert said.startswith("no samples arrived for 0.5s; 4 read were of versions a killed"), said
    waiting = [r.getMessage() for r in caplog.records if "has 0 of 2 samples" in r.getMessage()]
    assert waiting and all("slower than this learner" not in w for w in waiting), waiting
    assert "4 read were of versions a killed learner published" in waiting[-1], waiting


def test_policy_lag_metrics_count_updates_along_the_branch() -> None:
    """A learner resumed at 3 and renumbered 6: its version-3 samples are of the weights it
    holds (lag 0), not 3 updates old, and a version-2 sample one update older (review
    finding 2); the trainer's metrics read the learner's `version_position`."""
    from ludic.pipeline.versions import Forks
    from ludic.training.mismatch import policy_lag_metrics

    forks = Forks()
    forks.add(3, 6)
    items = [sample(versions=(3,)), sample(versions=(2,)), sample(versions=(6,))]
    metrics = policy_lag_metrics(6, items, position=forks.position)
    assert (metrics["policy_lag/0"], metrics["policy_lag/1"], metrics["policy_lag/max"]) == (
        2.0,
        1.0,
        1.0,
    )
    assert policy_lag_metrics(6, items)["policy_lag/3+"] == 2.0  # raw numbers: 3 and 4 "updates"
