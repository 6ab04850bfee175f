"""`ludic actor` records the preset that assigned credit; `ludic learner` refuses samples another
preset credited (fails if the record is not written, not read, or a mismatch trains silently)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server, sample

from ludic.cli import main as ludic_main
from ludic.pipeline.codec import encode_sample
from ludic.pipeline.credit_check import CreditCheck, CreditMismatchError, credit_record
from ludic.pipeline.learner_report import NothingTrainedLearnerError
from ludic.pipeline.stream import SampleStream
from ludic.recipes.algorithms import GiGPOOptions

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
__all__ = ["redis_server"]


def _actor(redis: RedisServer, *extra: str) -> None:
    args = ["actor", "--redis-url", redis.url, "--stream", "s", "--env", "pipeline_fakes:CountOEnv"]
    args += ["--max-steps", "1", "--max-tokens", "8", "--problems-per-batch", "2"]
    args += ["--group-size", "2", "--batches", "1", *extra]
    ludic_main(args)


def _learner(redis: RedisServer, out: Path, *extra: str) -> None:
    args = ["learner", "--redis-url", redis.url, "--stream", "s", "--batch-size", "4"]
    args += ["--steps", "1", "--max-wait-s", "5", "--out-dir", str(out), *extra]
    ludic_main(args)


def _pending(redis: RedisServer) -> int:
    return int(redis.client().xpending("s", "ludic-learners")["pending"])


@pytest.mark.slow
def test_learner_refuses_samples_another_preset_credited(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    _actor(redis_server, "--algorithm", "rloo")
    with pytest.raises(CreditMismatchError) as e:
        _learner(redis_server, tmp_path / "l", "--algorithm", "gigpo")
    message = str(e.value)
    assert "--algorithm rloo" in message and "--algorithm gigpo" in message
    assert "Restart the learner with --algorithm rloo" in message
    assert (
        not (tmp_path / "l" / "metrics.jsonl").exists()
        or not (tmp_path / "l" / "metrics.jsonl").read_text()
    )  # no step trained on the wrong credit
    assert _pending(redis_server) > 0  # left unacked: a fixed learner trains them
    _learner(redis_server, tmp_path / "l", "--algorithm", "rloo")
    assert (tmp_path / "l" / "metrics.jsonl").read_text().count("\n") == 1


@pytest.mark.slow
def test_learner_refuses_samples_of_another_dr_grpo_budget(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """dr_grpo's loss divides by --max-tokens: a learner dividing by another budget than the
    actors generated with is refused, naming both values, before any step."""
    _actor(redis_server, "--algorithm", "dr_grpo")  # generated with --max-tokens 8
    with pytest.raises(CreditMismatchError) as e:
        _learner(redis_server, tmp_path / "l", "--algorithm", "dr_grpo", "--max-tokens", "128")
    message = str(e.value)
    assert "actor 'actor' generated with --max-tokens 8" in message
    assert "--algorithm dr_grpo with --max-tokens 128" in message
    assert "Restart the learner with --max-tokens 8" in message
    metrics = tmp_path / "l" / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text()  # no step on the wrong normaliser
    assert _pending(redis_server) > 0
    _learner(redis_server, tmp_path / "l", "--algorithm", "dr_grpo", "--max-tokens", "8")
    assert metrics.read_text().count("\n") == 1


@pytest.mark.slow
def test_matching_gigpo_actor_and_learner_train(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _actor(redis_server, "--algorithm", "gigpo", "--gigpo.omega", "0.3")
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.credit_check"):
        _learner(redis_server, tmp_path / "l", "--algorithm", "gigpo")
    assert (tmp_path / "l" / "metrics.jsonl").read_text().count("\n") == 1
    # the learner takes no --gigpo.* flags (credit ran on the actor): it says which it trains on
    [line] = [r.getMessage() for r in caplog.records if "credit assigned with" in r.getMessage()]
    assert line.startswith("samples from actor 'actor': credit assigned with --algorithm gigpo")
    assert "--gigpo.omega 0.3" in line and "--gigpo.default-step-reward 0.0" in line


@pytest.mark.slow
def test_resumed_learner_dead_letters_actors_restarted_with_other_gigpo_knobs(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The learner takes no --gigpo.* flags, so a run whose actors are all restarted with other
    knobs would mix two credit assignments across a learner restart: such actors are another
    run (their run id differs), and the resumed learner, whose checkpoint records its run,
    dead-letters their samples, naming both runs, instead of training them."""
    out = tmp_path / "l"
    _actor(redis_server, "--algorithm", "gigpo", "--gigpo.omega", "0.3")
    _learner(redis_server, out, "--algorithm", "gigpo", "--checkpoint-every", "1")
    _actor(redis_server, "--algorithm", "gigpo", "--gigpo.omega", "0.5")
    nothing = "no step trained in this launch: .*4 dead-lettered as another run's"
    refused = pytest.raises(NothingTrainedLearnerError, match=nothing)  # the command exits 1
    with caplog.at_level(logging.INFO, logger="ludic.pipeline"), refused:
        _learner(redis_server, out, "--algorithm", "gigpo", "--steps", "2")
    [error] = [r.getMessage() for r in caplog.records if "two runs" in r.getMessage()]
    assert "as its checkpoint records" in error and "another --stream" in error
    [done] = [r.getMessage() for r in caplog.records if "learner done" in r.getMessage()]
    assert "0 samples read, 4 dead-lettered as another run's" in done, done
    assert (out / "metrics.jsonl").read_text().count("\n") == 1  # no step on the new credit
    assert redis_server.client().xlen("s:dead") == 4  # kept there, never trained by this run
    assert _pending(redis_server) > 0  # no checkpoint acked them: a run of their own trains them
    _learner(redis_server, tmp_path / "new", "--algorithm", "gigpo")
    assert (tmp_path / "new" / "metrics.jsonl").read_text().count("\n") == 1


def test_stream_without_record_gets_one_notice(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def push() -> None:
        stream = SampleStream(redis_server.url, stream="s", group="ludic-learners")
        await stream.ensure_group()
        for i in range(4):
            await stream.add(encode_sample(sample(), sample_id=f"old:{i}"))
        await stream.aclose()

    asyncio.run(push())
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.credit_check"):
        _learner(redis_server, tmp_path / "l", "--algorithm", "gigpo")
    notices = [r for r in caplog.records if "do not record which --algorithm" in r.message]
    assert len(notices) == 1, notices
    assert (tmp_path / "l" / "metrics.jsonl").read_text().count("\n") == 1


def _stamped(record: dict[str, object], actor: str):  # type: ignore[no-untyped-def]
    item = sample()
    return type(item)(
        input_ids=item.input_ids,
        action_mask=item.action_mask,
        weight=item.weight,
        behavior_logprobs=item.behavior_logprobs,
        meta={**item.meta, "credit": record, "actor_id": actor},
    )


def test_two_actors_with_different_gigpo_flags_are_refused() -> None:
    check = CreditCheck("gigpo")
    check(_stamped(credit_record("gigpo", GiGPOOptions(omega=0.3)), "a"))
    check(_stamped(credit_record("gigpo", GiGPOOptions(omega=0.3)), "a2"))
    with pytest.raises(
        CreditMismatchError, match=r"'a' with --algorithm gigpo --gigpo.omega 0.3, 'b'"
    ):
        check(_stamped(credit_record("gigpo", GiGPOOptions(omega=0.5)), "b"))


def test_two_dr_grpo_actors_with_other_budgets_are_refused() -> None:
    check = CreditCheck("dr_grpo", max_tokens=64)
    check(_stamped(credit_record("dr_grpo", max_tokens=64), "a"))
    with pytest.raises(
        CreditMismatchError, match=r"'b' generated with --max-tokens 128 .* --max-tokens 64"
    ):
        check(_stamped(credit_record("dr_grpo", max_tokens=128), "b"))


def test_only_dr_grpo_records_the_budget() -> None:
    assert credit_record("grpo", max_tokens=64) == {"algorithm": "grpo", "flags": {}}
    assert credit_record("dr_grpo", max_tokens=64)["flags"] == {"max_tokens": 64}
    check = CreditCheck("grpo")  # actors of another budget are fine where no loss divides by it
    check(_stamped(credit_record("grpo", max_tokens=64), "a"))
    check(_stamped(credit_record("grpo", max_tokens=128), "b"))


def test_dr_grpo_record_without_budget_gets_one_notice(caplog: pytest.LogCaptureFixture) -> None:
    old = {"algorithm": "dr_grpo", "flags": {}}  # an actor from before the budget was recorded
    check = CreditCheck("dr_grpo", max_tokens=64)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.credit_check"):
        check(_stamped(old, "a"))
        check(_stamped(old, "a"))
    notices = [r for r in caplog.records if "do not record the --max-tokens" in r.getMessage()]
    assert len(notices) == 1


def test_the_first_record_travels_in_checkpoints() -> None:
    first = CreditCheck("gigpo")
    assert first.state_dict() is None  # nothing recorded yet
    first(_stamped(credit_record("gigpo", GiGPOOptions(omega=0.3)), "a"))
    resumed = CreditCheck("gigpo")
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))  # as state.json holds it
    resumed(_stamped(credit_record("gigpo", GiGPOOptions(omega=0.3)), "a"))
    with pytest.raises(CreditMismatchError, match=r"resumed a checkpoint .* --gigpo.omega 0.3"):
        resumed(_stamped(credit_record("gigpo", GiGPOOptions(omega=0.5)), "a"))


@pytest.mark.parametrize("quiet", [False, True])
def test_a_quiet_check_logs_nothing_but_still_refuses(
    quiet: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # A learner rank other than 0 checks quietly: under torchrun rank 0 says each line once.
    recorded = _stamped(credit_record("dr_grpo", max_tokens=64), "a")
    unrecorded = dataclasses.replace(recorded, meta={"actor_id": "old"})  # an older actor
    check = CreditCheck("dr_grpo", max_tokens=64, quiet=quiet)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.credit_check"):
        check(recorded)  # the first record's settings
        check(unrecorded)  # the notice that it cannot be checked
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == (0 if quiet else 2), said
    with pytest.raises(CreditMismatchError):
        check(_stamped(credit_record("dr_grpo", max_tokens=128), "c"))
