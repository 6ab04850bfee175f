"""PrefetchBatchSource keeps the wrapped source's cross-rank check (`check_ranks`, a
`RankCheckedSource`): the Trainer calls it through the wrapper before each step trains, the check
sees the handed batch only (the next draw starts after it), and a source without the check
stays without it (no collective added)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from training_fakes import ListSource, WeightedNLL, item, params_snapshot, tiny_llama

from ludic.training import PrefetchBatchSource, RLAlgorithm, Trainer, TrainerConfig
from ludic.training.credit import MonteCarloReturn
from ludic.training.parallel import RankCheckedSource


class CheckedSource(ListSource):
    """A ListSource whose ranks check what it read; the check refuses at `refuse_at` (the
    number of batches drawn) and records how many batches were drawn when it ran."""

    def __init__(self, refuse_at: int | None = None) -> None:
        super().__init__([[item(5, seed=i, index=i)] for i in range(4)])
        self.refuse_at = refuse_at
        self.checked_at: list[int] = []

    def check_ranks(self, all_gather: Callable[[Any], list[Any]]) -> None:
        gathered = all_gather(self.position)
        self.checked_at.append(self.position)
        if self.position == self.refuse_at:
            raise ValueError(f"ranks disagree after batch {self.position}: {gathered}")


def algorithm() -> RLAlgorithm:
    return RLAlgorithm(name="nll", credit_assigner=MonteCarloReturn(), loss=WeightedNLL())


def test_the_wrapper_is_rank_checked_only_when_its_source_is() -> None:
    checked = PrefetchBatchSource(CheckedSource())
    plain = PrefetchBatchSource(ListSource([[item(5)]]))
    try:
        assert isinstance(checked, RankCheckedSource)
        assert not isinstance(plain, RankCheckedSource)
    finally:
        checked.close()
        plain.close()


def test_the_check_sees_the_handed_batch_and_the_next_draw_starts_after_it() -> None:
    inner = CheckedSource()
    source = PrefetchBatchSource(inner)

    async def two_batches() -> None:
        for expected in (1, 2):
            await source.next_batch()
            assert inner.position == expected  # nothing drawn ahead before the check
            source.check_ranks(lambda obj: [obj])
            source.wait(timeout=30)
            assert inner.position == expected + 1  # drawn ahead once checked

    try:
        asyncio.run(two_batches())
        assert inner.checked_at == [1, 2]
    finally:
        source.close()


def test_a_trainer_refuses_the_step_its_wrapped_sources_check_refuses() -> None:
    """Without the forwarding the check never ran and step 2 trained on the refused batch."""
    inner = CheckedSource(refuse_at=2)
    source = PrefetchBatchSource(inner)
    trainer = Trainer(tiny_llama(), algorithm(), source, TrainerConfig(max_lag=1))
    try:
        asyncio.run(trainer.train_step())
        before = params_snapshot(trainer.model)
        with pytest.raises(ValueError, match="ranks disagree after batch 2"):
            asyncio.run(trainer.train_step())
        assert trainer.step == 1
        after = params_snapshot(trainer.model)
        assert all((before[k] == after[k]).all() for k in before)  # step 2 did not train
        assert inner.checked_at == [1, 2]
    finally:
        trainer.close()
        source.close()
