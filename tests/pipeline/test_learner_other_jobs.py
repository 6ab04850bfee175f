"""Two learner jobs on one stream are refused: under another --consumer name the group would
split the samples between them, and in another --group each would delete what it acknowledges
from under the other, so each trained part of the run without a word. The ranks of this job and
a lease nobody renews (a learner killed just before) are no other job. Real redis-server."""

from __future__ import annotations

import json
import logging

import pytest
from pipeline_fakes import RedisServer, redis_server

from ludic.pipeline.lease import ConsumerInUseError, ConsumerLease, refuse_other_learners

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]


def _hold(server: RedisServer, group: str, consumer: str) -> ConsumerLease:
    lease = ConsumerLease(server.url, stream="s", group=group, consumer=consumer, ttl_s=0.6)
    lease.acquire()
    return lease


def _refuse(server: RedisServer) -> None:
    refuse_other_learners(server.url, stream="s", group="g", consumer="learner")


@pytest.mark.parametrize(("group", "consumer"), [("g", "learner2-r0"), ("g2", "learner-r0")])
def test_a_live_learner_of_another_job_on_the_stream_is_refused(
    redis_server: RedisServer, group: str, consumer: str
) -> None:
    other = _hold(redis_server, group, consumer)
    try:
        with pytest.raises(ConsumerInUseError) as refused:
            _refuse(redis_server)  # once it sees that lease renewed
    finally:
        other.release()
    message = str(refused.value)
    assert "stream 's' is read by another running learner (host" in message
    assert f"pid {json.loads(other.value)['pid']}" in message
    assert f"group and consumer '{group}:{consumer}'" in message
    assert "its own --stream" in message and "ranks of one torchrun job" in message


def test_this_jobs_ranks_and_a_killed_learners_lease_are_no_other_job(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    ranks = [_hold(redis_server, "g", f"learner-r{r}") for r in range(2)]
    killed = _hold(redis_server, "g", "gone-r0")
    killed._stop.set()  # as after SIGKILL: no renewal, no release; it expires within its ttl
    try:
        with caplog.at_level(logging.INFO, logger="ludic.pipeline.lease"):
            _refuse(redis_server)
    finally:
        for lease in ranks:
            lease.release()
    assert "another learner's lease on stream 's' (s:lease:g:gone-r0)" in caplog.text
    assert redis_server.client().exists(killed.key) == 0
