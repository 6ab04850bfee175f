"""A checkpoint saved again before its restored data position is put to use (a learner resumed
at --steps, whose closing save rewrites that step with nothing trained) still lists the samples
the restored checkpoint had not acknowledged, so a later resume acks them instead of training
them twice. A `PipelineBatchSource` against a real redis-server, then real `python -m
ludic.pipeline learner` processes, the first one SIGKILLed between its closing checkpoint and
the ack (`learner_killed_before_ack`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server, sample, spawn
from test_pipeline_processes import SPEC, _actor, _learner, _produced_ids, _sample_ids, _wait

from ludic.models import tiny_model_dir
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.stream import SampleStream
from ludic.training.checkpoint import STATE

__all__ = ["redis_server"]
ACKED = "s:acked:g"


def _stream(server: RedisServer) -> SampleStream:
    return SampleStream(server.url, stream="s", group="g", ledger="s:ledger", retry_cap_s=0.2)


def _ledger(server: RedisServer) -> list[str]:
    return [i for _, f in server.client().xrange("s:ledger") for i in json.loads(f[b"ids"])]


async def _trained_state(server: RedisServer) -> dict:  # type: ignore[type-arg]
    """The data position of a checkpoint after 2 steps of 2 samples, never acked (its learner
    was killed before its next batch): id0..id3 pending for learner-r0."""
    stream = _stream(server)
    for i in range(6):
        await stream.add(encode_sample(sample(), sample_id=f"id{i}"))
    first = PipelineBatchSource(stream, batch_size=2, block_ms=100, lease_ttl_s=None)
    await first.next_batch()
    await first.next_batch()
    state = first.state_dict()
    await first.aclose()
    assert [pair[1] for pair in state["trained"]] == ["id0", "id1", "id2", "id3"]
    return state


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_state_saved_before_any_batch_keeps_the_restored_position(
    redis_server: RedisServer,
) -> None:
    state = await _trained_state(redis_server)
    resumed = PipelineBatchSource(_stream(redis_server), batch_size=2, block_ms=100)
    resumed.load_state_dict(state)
    resaved = resumed.state_dict()  # a save of the same step, nothing read since the resume
    assert resaved["trained"] == state["trained"]
    assert resaved["batches_served"] == 2
    # nothing is acked for it, nor recorded as acked up to step 2 (a world-size change on a
    # later resume trusts that record)
    assert await resumed.ack_checkpointed() == 0
    assert _ledger(redis_server) == [] and redis_server.client().hget(ACKED, "learner-r0") is None
    # and again: the position survives any number of such saves
    assert resumed.state_dict()["trained"] == state["trained"]
    await resumed.aclose()
    # a later resume from the re-saved state acks id0..id3 and trains what follows
    later = PipelineBatchSource(_stream(redis_server), batch_size=2, block_ms=100)
    later.load_state_dict(resaved)
    batch = await later.next_batch()
    assert [item.meta["sample_id"] for item in batch.items] == ["id4", "id5"]
    assert _ledger(redis_server) == ["id0", "id1", "id2", "id3"]
    assert later.totals["redelivered"] == 0
    await later.aclose()


@pytest.mark.redis
@pytest.mark.timeout(60)
async def test_a_restored_state_from_other_ranks_keeps_their_check(
    redis_server: RedisServer,
) -> None:
    """Resumed on 1 rank from a 2-rank checkpoint and saved before any batch: the state still
    says 2 ranks, so the next resume still checks that rank 1 acked its samples."""
    state = await _trained_state(redis_server)
    two_ranks = {**state, "world_size": 2}
    resumed = PipelineBatchSource(_stream(redis_server), batch_size=2, block_ms=100)
    resumed.load_state_dict(two_ranks)
    resaved = resumed.state_dict()
    await resumed.aclose()
    assert resaved["world_size"] == 2 and resaved["trained"] == state["trained"]
    later = PipelineBatchSource(_stream(redis_server), batch_size=2, block_ms=100)
    later.load_state_dict(resaved)
    with pytest.raises(RuntimeError, match="learner-r1 had not acknowledged its samples"):
        await later.next_batch()
    await later.aclose()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_learner_resumed_at_its_last_step_keeps_the_samples_to_acknowledge(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    model = ["--model", str(tiny_model_dir(spec=SPEC))]
    actor = spawn(_actor(redis_server, tmp_path, batches=4, extra=model), tmp_path / "actor.log")
    _wait(actor, tmp_path / "actor.log")  # 16 samples: 4 steps of 4
    produced = _produced_ids(tmp_path)
    assert len(produced) == 16
    flags = ["--max-lag", "None", "--checkpoint-every", "2", "--max-wait-s", "30"]
    flags += ["--lease-ttl-s", "2"]  # the killed learner's lease is not waited out for long

    def learner(name: str, steps: int, *launcher: str) -> tuple[int, str]:
        args = _learner(redis_server, tmp_path, extra=[*flags, "--steps", str(steps)])
        if launcher:  # `-m learner_killed_before_ack 3 learner ...` for `-m ludic.pipeline`
            args = ["-m", *launcher, *args[3:]]
        process = spawn(args, tmp_path / name)
        code = process.wait(timeout=300)
        return code, (tmp_path / name).read_text()

    # 1: steps 1-3; step 3 (off the interval) is saved on the way out, then SIGKILL: its 4
    # samples are in the checkpoint and still pending
    code, log = learner("l1.log", 3, "learner_killed_before_ack", "3", "learner")
    assert code == -9, log[-3000:]
    step_3 = tmp_path / "learner" / "checkpoints" / "step_00000003"
    listed = json.loads((step_3 / STATE).read_text())["data_state"]["trained"]
    assert [sample_id for _, sample_id in listed] == produced[8:12]
    assert Counter(_sample_ids(redis_server)) == Counter(produced[:8])
    assert redis_server.client().xpending("ludic:samples", "ludic-learners")["pending"] == 4
    # 2: resumed at --steps 3: nothing to train, refused before anything loads, so step 3 is
    # kept as saved (a re-save would record this launch's rank count, and a source that had
    # read nothing)
    saved_folder = step_3.stat().st_ino
    code, log = learner("l2.log", 3)
    assert code == 1, log[-3000:]
    assert "nothing is left to train" in log and "learner step" not in log
    assert step_3.stat().st_ino == saved_folder, "step 3 was saved again with nothing trained"
    listed = json.loads((step_3 / STATE).read_text())["data_state"]["trained"]
    assert [sample_id for _, sample_id in listed] == produced[8:12]
    # 3: one more step acks step 3's samples (held by its checkpoint) and trains the last 4
    code, log = learner("l3.log", 4)
    assert code == 0, log[-3000:]
    assert "acked 4 entries the checkpoint already holds" in log, log[-3000:]
    assert "replays" not in log
    assert Counter(_sample_ids(redis_server)) == Counter(produced)  # each exactly once
    assert redis_server.client().xlen("ludic:samples") == 0
