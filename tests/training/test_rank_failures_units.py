"""`raise_together` / `run_together` / `run_on_main` in one process, with a scripted peer rank:
a failure on any rank raises on every rank (the failed one its own error, type kept; the
others `RankFailedError` naming it), one all-reduce when all went well, and none at all in one
process. The 2-rank runs are in test_fsdp_rank_failures.py."""

from __future__ import annotations

import errno
import pickle
from typing import Any

import pytest
from training_fakes import (
    CountingRuntime,
    ListSource,
    PeerRuntime,
    WeightedNLL,
    mixed_items,
    tiny_llama,
)

from ludic.distributed import WeightPushError
from ludic.training import (
    ConstantCredit,
    RankFailedError,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
)
from ludic.training.parallel import raise_together, run_on_main, run_together
from ludic.training.trainer_guards import check_publisher_rank, publish_finite


def test_one_process_raises_the_error_itself_with_no_agreement() -> None:
    runtime = CountingRuntime()
    error = WeightPushError("server refused")
    with pytest.raises(WeightPushError) as caught:
        raise_together(runtime, error, "publishing policy version 2")
    assert caught.value is error
    assert run_together(runtime, lambda: 42, "anything") == 42
    raise_together(runtime, None, "anything")
    assert runtime.calls == []


def test_when_all_went_well_ranks_agree_with_one_all_reduce() -> None:
    runtime = PeerRuntime(rank=1)
    assert run_together(runtime, lambda: "done", "logging step 3") == "done"
    assert runtime.calls == ["any_rank"]


def test_the_other_rank_raises_naming_the_failed_rank_and_the_cause() -> None:
    runtime = PeerRuntime(rank=1, peer_cause="WeightPushError: server refused version 2")
    with pytest.raises(RankFailedError) as caught:
        run_together(runtime, lambda: None, "publishing policy version 2")
    error = caught.value
    assert isinstance(error, RuntimeError)
    assert (error.failed_rank, error.doing) == (0, "publishing policy version 2")
    assert error.cause == "WeightPushError: server refused version 2"
    assert str(error).startswith(
        "rank 0 failed while publishing policy version 2: WeightPushError: server refused"
    )
    assert "rank 1 stops with it" in str(error)
    copied = pickle.loads(pickle.dumps(error))  # e.g. sent back from a worker process
    assert (str(copied), copied.failed_rank, copied.cause) == (str(error), 0, error.cause)
    assert runtime.calls == ["any_rank", "all_gather_object"]


def test_the_failed_rank_raises_its_own_error_after_telling_the_others() -> None:
    runtime = PeerRuntime(rank=0)

    def push() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        run_together(runtime, push, "logging step 2")
    assert runtime.calls == ["any_rank", "all_gather_object"]  # the others got the cause


def test_run_on_main_names_rank_0_and_what_it_was_doing() -> None:
    runtime = PeerRuntime(rank=1, peer_cause="OSError: [Errno 28] No space left on device")
    with pytest.raises(RankFailedError, match="rank 0 failed while saving the checkpoint"):
        run_on_main(runtime, lambda: None, "saving the checkpoint of step 4")


class RefusingPublisher:
    def publish(self, weights: Any, *, version: int) -> None:
        raise WeightPushError(f"server refused version {version}")


def test_publish_finite_keeps_the_publishers_error_type_in_one_process() -> None:
    runtime = CountingRuntime()
    with pytest.raises(WeightPushError, match="refused version 3"):
        publish_finite(runtime, tiny_llama(), RefusingPublisher(), version=3)


class FullDiskLogger:
    def log(self, metrics: Any, step: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "metrics.jsonl")

    def close(self) -> None:
        return None


def test_a_trainers_logger_error_reaches_the_caller_unchanged() -> None:
    algorithm = RLAlgorithm(name="t", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())
    trainer = Trainer(
        tiny_llama(),
        algorithm,
        ListSource([mixed_items(2)]),
        TrainerConfig(micro_batch_tokens=32),
        logger=FullDiskLogger(),
    )
    with pytest.raises(OSError, match="No space left") as caught:
        trainer.run(1, progress=False)
    assert caught.value.filename == "metrics.jsonl"


def test_a_publisher_on_another_rank_but_not_rank_0_is_refused() -> None:
    publisher = RefusingPublisher()
    with pytest.raises(
        ValueError, match=r"publisher was given on rank\(s\) \[1\] but not on rank 0"
    ):
        check_publisher_rank(PeerRuntime(rank=1, peer_cause=False), publisher)
    assert check_publisher_rank(PeerRuntime(rank=1, peer_cause=True), None)
    assert not check_publisher_rank(PeerRuntime(rank=0, peer_cause=False), None)
    assert check_publisher_rank(CountingRuntime(), publisher)
