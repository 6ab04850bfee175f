"""`<stream>:published-version` names the run of the learner that published: a stream name reused
by a new run no longer makes that run's versions jump past the old run's. A learner that knows
its run (`--run-id`, its checkpoint's) and finds another run's record numbers its own versions,
and its first publish (a resumed one's: at resume) replaces the record, saying so naming both
runs; a record of its own run, or one it cannot compare (its run not known yet under torchrun,
or a record older than run names), is forked past as before (a killed learner of its run), the
fork line naming the record's run. A fresh learner in one process decides at its first sample
(`test_learner_fork_at_first_sample`)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.pipeline.learner_run import fork_versions
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


class _Pushes:
    def publish(self, weights: object, *, version: int) -> None:
        pass


def _record(server: RedisServer, version: int, run: str | None) -> None:
    server.client().set(published_key("s"), json.dumps({"version": version, "run": run or ""}))


def _learner(
    server: RedisServer, run: str | None, world_size: int = 1
) -> tuple[SimpleNamespace, PipelineBatchSource]:
    """A fresh learner (version 0) whose run is `run` from the start (None: not known yet), rank
    0 of `world_size`."""
    source = PipelineBatchSource(
        SampleStream(server.url, stream="s"), batch_size=1, run_id=run, world_size=world_size
    )
    trainer = SimpleNamespace(policy_version=0, step=0, publish_weights=lambda: None)
    return trainer, source


def _other_run_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "stream 's' records" in r.getMessage()]


async def test_another_runs_record_is_replaced_not_forked_past(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    _record(redis_server, 40, "run-old")
    trainer, source = _learner(redis_server, "run-new")
    publisher = RecordingPublisher(
        _Pushes(), url=redis_server.url, stream="s", run=lambda: source.run_check.run
    )
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        fork_versions(trainer, source, redis_server.url)
        assert trainer.policy_version == 0 and source.staleness.forks.forks == []
        publisher.publish({}, version=0)  # `_train`'s publish before step 1
        publisher.publish({}, version=1)
    publisher.close()
    (line,) = _other_run_warnings(caplog)  # said once, by the publish that replaced it
    assert "records policy versions up to 40 published by a learner of run run-old" in line
    assert "not this learner's run run-new: a stream name reused by a new run" in line
    assert "numbers its versions as its own (version 0 published now, not past" in line
    assert published_record(redis_server.url, "s") == PublishedRecord(1, "run-new")
    await source.aclose()


@pytest.mark.parametrize("recorded", [40, 2])  # past its checkpoint's version 3, or below it
async def test_a_resumed_learner_says_it_replaces_another_runs_record(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, recorded: int
) -> None:
    """A learner resumed at version 3 whose checkpoint pinned run-new: `Trainer.resume`
    publishes before `fork_versions` reads the record, so the publish that replaces run-old's
    record is the one that says so, as a fresh `--run-id` learner's first publish does."""
    _record(redis_server, recorded, "run-old")
    trainer, source = _learner(redis_server, None)
    source.run_check.load_state_dict({"id": "run-new", "actor": "a"})  # the checkpoint's run
    publisher = RecordingPublisher(
        _Pushes(), url=redis_server.url, stream="s", run=lambda: source.run_check.run
    )
    trainer.policy_version, trainer.step = 3, 3
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        publisher.publish({}, version=3)  # `Trainer.resume`'s publish of the restored weights
        fork_versions(trainer, source, redis_server.url)
        publisher.publish({}, version=4)
    publisher.close()
    assert trainer.policy_version == 3 and source.staleness.forks.forks == []
    (line,) = _other_run_warnings(caplog)
    assert f"records policy versions up to {recorded} published by a learner of run run-old" in line
    assert "not this learner's run run-new" in line and "(version 3 published now" in line
    assert published_record(redis_server.url, "s") == PublishedRecord(4, "run-new")
    await source.aclose()


@pytest.mark.parametrize(
    ("recorded", "learner", "note"),
    [
        ("run-a", "run-a", False),  # its own run's killed learner
        ("run-a", None, True),  # under torchrun each rank's run is its first sample's
        (None, "run-a", False),  # a record that names no run
    ],
)
async def test_a_record_of_its_run_or_one_it_cannot_compare_is_forked_past(
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    recorded: str | None,
    learner: str | None,
    note: bool,
) -> None:
    _record(redis_server, 4, recorded)
    trainer, source = _learner(redis_server, learner, world_size=2)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline"):
        fork_versions(trainer, source, redis_server.url)
    assert trainer.policy_version == 5 and source.staleness.forks.dead(4) == (0, 5)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("a learner before this one published policy versions up to 4")
    assert ("the record names run run-a; this learner's run is not known yet" in line) is note
    await source.aclose()


def test_the_record_keeps_its_run_and_reads_a_bare_version(redis_server: RedisServer) -> None:
    redis_server.client().set(published_key("s"), 7)  # written before records named runs
    assert published_record(redis_server.url, "s") == PublishedRecord(7, None)
    run: list[str | None] = [None]
    publisher = RecordingPublisher(_Pushes(), url=redis_server.url, stream="s", run=lambda: run[0])
    publisher.publish({}, version=8)  # a fresh learner's first publish, its run not known
    assert published_record(redis_server.url, "s") == PublishedRecord(8, None)
    run[0] = "run-a"  # pinned by its first batch
    publisher.publish({}, version=9)
    publisher.publish({}, version=3)  # a resumed learner republishing: never lowered
    run[0] = None
    publisher.publish({}, version=2)  # a run not known replaces nothing
    publisher.close()
    assert published_record(redis_server.url, "s") == PublishedRecord(9, "run-a")
