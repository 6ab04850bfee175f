"""Run identity on the stream: every sample an actor pushes carries its run id; a learner trains
the run of the first stamped sample it reads (or the one its checkpoint records) and
dead-letters another run's samples, logging both runs and the fix once per foreign run; samples
without a run id (older actors) are trained after one notice. Real redis-server."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
from pipeline_fakes import CountOEnv, RedisServer, expire_leases, redis_server, sample

from ludic.agents import Agent
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.pipeline.actor import PipelineActor
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.run_check import RUN_KEY, run_id_for
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.rollouts import ComponentSpec, GRPORequestStrategy, RolloutEngine, RolloutRequest
from ludic.training import BatchSourceExhausted
from ludic.training.credit import GroupNormalizedReturn

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
__all__ = ["redis_server"]

OURS = run_id_for({"env": "tictactoe", "algorithm": "grpo"})
THEIRS = run_id_for({"env": "guess_number", "algorithm": "grpo"})


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)


async def _push(stream: SampleStream, sample_id: str, run: object, actor: str) -> None:
    """A sample of actor `actor` stamped with run id `run` (None: no run id, an older actor)."""
    item = sample()
    meta = {**item.meta, "actor_id": actor, **({RUN_KEY: run} if run is not None else {})}
    await stream.add(encode_sample(replace(item, meta=meta), sample_id=sample_id))


def _ids(items: list) -> list[str]:  # type: ignore[type-arg]
    return [i.meta["sample_id"] for i in items]


def test_run_ids_are_stable_and_tell_settings_apart() -> None:
    assert run_id_for({"algorithm": "grpo", "env": "tictactoe"}) == OURS  # key order: no matter
    assert OURS != THEIRS and OURS.startswith("run-") and len(OURS) == 20


async def test_another_runs_samples_are_dead_lettered_naming_both_runs(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await _push(stream, "a:0:0", OURS, "a")
    await _push(stream, "b:0:0", THEIRS, "b")
    await _push(stream, "a:0:1", OURS, "a")
    await _push(stream, "b:0:1", THEIRS, "b")
    await _push(stream, "a:0:2", OURS, "a")
    source = PipelineBatchSource(stream, batch_size=3, block_ms=100)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        batch = await source.next_batch()
    assert _ids(batch.items) == ["a:0:0", "a:0:1", "a:0:2"]  # run b's samples are not trained
    assert batch.stats["pipeline/foreign_run"] == 2.0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # once per foreign run, not per sample
    [error] = errors
    assert f"run {THEIRS} (actor 'b')" in error and f"trains run {OURS}" in error
    assert "from actor 'a'" in error and "another --stream" in error
    assert f"this learner trains run {OURS}" in caplog.text  # the pinned run is said
    dead = redis_server.client().xrange("s:dead")
    assert len(dead) == 2
    assert all(f"from run {THEIRS}".encode() in fields[b"error"] for _, fields in dead)
    await source.commit()
    assert redis_server.client().xlen("s") == 0  # acked: never delivered again
    ledger = [i for _, f in redis_server.client().xrange("s:ledger") for i in json.loads(f[b"ids"])]
    assert sorted(i for i in ledger if not i.startswith("foreign:")) == ["a:0:0", "a:0:1", "a:0:2"]
    await source.aclose()


async def test_a_resumed_learner_keeps_the_run_its_checkpoint_records(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await _push(stream, "a:0:0", OURS, "a")
    first = PipelineBatchSource(stream, batch_size=1, block_ms=100)
    await first.next_batch()
    state = first.state_dict()  # the checkpoint after the step on a:0:0
    assert state["run"] == {"id": OURS, "actor": "a"}
    expire_leases(first)
    # the run's actors are gone; another run's actor now writes to the stream
    await _push(stream, "b:0:0", THEIRS, "b")
    resumed = PipelineBatchSource(_stream(redis_server), batch_size=1, block_ms=50, max_wait_s=0.5)
    resumed.load_state_dict(state)
    refused = pytest.raises(BatchSourceExhausted, match="1 read came from another run")
    with caplog.at_level(logging.ERROR, logger="ludic.pipeline"), refused:
        await resumed.next_batch()  # run b's sample is the first it reads: not its run
    assert "as its checkpoint records" in caplog.text and f"trains run {OURS}" in caplog.text
    assert resumed.state_dict()["run"] == {"id": OURS, "actor": "a"}
    await resumed.aclose()


async def test_samples_without_a_run_id_are_trained_after_one_notice(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await _push(stream, "old:0:0", None, "old")
    await _push(stream, "a:0:0", OURS, "a")
    await _push(stream, "old:0:1", None, "old")
    source = PipelineBatchSource(stream, batch_size=3, block_ms=100)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"):
        batch = await source.next_batch()
    assert _ids(batch.items) == ["old:0:0", "a:0:0", "old:0:1"]
    notices = [r.getMessage() for r in caplog.records if "carries no run id" in r.getMessage()]
    assert len(notices) == 1 and "actor 'old'" in notices[0]
    await source.aclose()


async def test_a_malformed_run_id_is_dead_lettered_as_invalid(redis_server: RedisServer) -> None:
    stream = _stream(redis_server)
    await stream.ensure_group()
    await _push(stream, "x:0:0", ["not", "a", "string"], "x")
    await _push(stream, "a:0:0", OURS, "a")
    source = PipelineBatchSource(stream, batch_size=1, block_ms=100)
    batch = await source.next_batch()
    assert _ids(batch.items) == ["a:0:0"] and batch.stats["pipeline/invalid"] == 1.0
    [(_, dead)] = redis_server.client().xrange("s:dead")
    assert b"meta 'run_id' must be a string" in dead[b"error"]
    await source.aclose()


async def test_the_actor_stamps_its_run_id_on_every_sample(redis_server: RedisServer) -> None:
    engine = RolloutEngine(
        env_registry={"count_o": CountOEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["oo", "x"])), max_steps=1)
        },
    )
    request = RolloutRequest(
        env=ComponentSpec(name="count_o"),
        protocol=ComponentSpec(name="single"),
        sampling=SamplingConfig(max_tokens=8),
    )
    actor = PipelineActor(
        engine=engine,
        stream=_stream(redis_server),
        requests_fn=lambda: [request],
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        strategy=GRPORequestStrategy(group_size=2),
        actor_id="a",
        run_id=OURS,
    )
    await actor.run(num_batches=2)
    source = PipelineBatchSource(_stream(redis_server), batch_size=4, block_ms=100)
    items = (await source.next_batch()).items
    assert len(items) == 4 and all(i.meta[RUN_KEY] == OURS for i in items)
    with pytest.raises(ValueError, match="run_id must be a string of 1-128 characters"):
        PipelineActor(
            engine=engine,
            stream=_stream(redis_server),
            requests_fn=lambda: [request],
            credit_assigner=GroupNormalizedReturn(normalize_std=False),
            run_id="",
        )
    await source.aclose()
