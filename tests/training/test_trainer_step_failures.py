"""A failure in one rank's own part of a step, in one process with a scripted peer rank: its
batch fetch and its loss reach every rank (`RankFailedError` on the others, the failed one its
own error), carried by the all-reduce the step makes anyway. In one process the error is
raised as it is. The 2-rank runs are in test_fsdp_rank_failures.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama

from ludic.training import (
    BatchSourceExhausted,
    ConstantCredit,
    LocalRuntime,
    LossInputs,
    LossOutput,
    RankFailedError,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
)
from ludic.training.parallel import next_batch_together, raise_if_any_failed
from ludic.training.trainer_guards import CaughtLoss


class ScriptedPeer(LocalRuntime):
    """This process as rank 0 of 2; the peer contributes `peer_max` to `all_reduce_max` and
    `peer_cause` to `all_gather_object` (its failure's cause, or None)."""

    def __init__(self, *, peer_max: int = 0, peer_cause: str | None = None) -> None:
        super().__init__("cpu")
        self.peer_max, self.peer_cause = peer_max, peer_cause
        self.calls: list[str] = []

    @property
    def world_size(self) -> int:
        return 2

    def all_reduce_max(self, value: int) -> int:
        self.calls.append("all_reduce_max")
        return max(value, self.peer_max)

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.calls.append("all_gather_object")
        return [obj, self.peer_cause]


async def _batch() -> str:
    return "batch"


async def _lost() -> str:
    raise ConnectionError("redis went away")


async def _ran_out() -> str:
    raise BatchSourceExhausted("no more rows")


async def test_a_peers_failed_fetch_is_a_rank_failed_error_naming_it() -> None:
    peer = ScriptedPeer(peer_max=2, peer_cause="ConnectionError: redis went away")
    with pytest.raises(RankFailedError) as caught:
        await next_batch_together(peer, _batch, "fetching the batch of step 3")
    assert (caught.value.failed_rank, caught.value.doing) == (1, "fetching the batch of step 3")
    assert caught.value.cause == "ConnectionError: redis went away"
    # a rank whose own data ran out stops with the failure too, not as a clean end of data
    with pytest.raises(RankFailedError):
        await next_batch_together(ScriptedPeer(peer_max=2, peer_cause="E: x"), _ran_out)


async def test_the_failed_fetch_raises_its_own_error_and_a_good_step_gathers_nothing() -> None:
    peer = ScriptedPeer()
    with pytest.raises(ConnectionError, match="redis went away"):
        await next_batch_together(peer, _lost)
    assert peer.calls == ["all_reduce_max", "all_gather_object"]
    peer = ScriptedPeer()
    assert await next_batch_together(peer, _batch) == "batch"
    assert peer.calls == ["all_reduce_max"]  # the one all-reduce a step already paid
    with pytest.raises(BatchSourceExhausted, match="another rank's batch source is exhausted"):
        await next_batch_together(ScriptedPeer(peer_max=1), _batch)


def test_raise_if_any_failed_needs_no_collective_when_none_failed() -> None:
    peer = ScriptedPeer()
    raise_if_any_failed(peer, None, False, "computing the loss of step 1")
    assert peer.calls == []
    with pytest.raises(RankFailedError, match="rank 1 failed while computing the loss"):
        raise_if_any_failed(
            ScriptedPeer(peer_cause="ValueError: nan"), None, True, "computing the loss of step 1"
        )


@dataclass(frozen=True, kw_only=True)
class RaisingLoss(WeightedNLL):
    calls: list[int] = field(default_factory=list)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        self.calls.append(1)
        raise ValueError("advantages_B holds a nan")


def _inputs() -> LossInputs:
    return LossInputs(
        logprobs_BT=torch.zeros(1, 2, requires_grad=True),
        action_mask_BT=torch.ones(1, 2),
        advantages_B=torch.ones(1),
        total_action_tokens=2.0,
        total_sequences=1.0,
    )


def test_caught_loss_keeps_the_first_error_and_gives_nan_so_the_passes_go_on() -> None:
    loss = RaisingLoss()
    caught = CaughtLoss(loss)
    assert (caught.needs_ref_logprobs, caught.needs_entropy) == (False, False)
    outs = [caught(_inputs()), caught(_inputs())]
    assert all(math.isnan(float(out.loss)) for out in outs)
    assert isinstance(caught.error, ValueError) and len(loss.calls) == 1
    fine = CaughtLoss(WeightedNLL())
    assert torch.isfinite(fine(_inputs()).loss) and fine.error is None


def _trainer(loss: Any, batches: Sequence[Any]) -> Trainer:
    algorithm = RLAlgorithm(name="t", credit_assigner=ConstantCredit(value=1.0), loss=loss)
    config = TrainerConfig(lr=1e-3, micro_batch_tokens=32, seed=0)
    return Trainer(tiny_llama(seed=0), algorithm, ListSource(batches), config)


def test_in_one_process_a_raising_loss_or_reducer_raises_as_it_is() -> None:
    trainer = _trainer(RaisingLoss(), [mixed_items(2, seed=1)])
    with pytest.raises(ValueError, match="advantages_B holds a nan"):
        trainer.run(1, progress=False)
    assert trainer.step == 0

    def broken(items: Any) -> float:
        raise KeyError("reward")

    trainer = _trainer(WeightedNLL(), [mixed_items(2, seed=1)])
    trainer.reducers["broken"] = broken  # type: ignore[assignment]
    with pytest.raises(KeyError, match="reward"):
        trainer.run(1, progress=False)
