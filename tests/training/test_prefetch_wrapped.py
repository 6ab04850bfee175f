"""A Trainer finds a `PrefetchBatchSource` under a wrapper that keeps it as `.source` (the
recipes' `log_samples`, as `ludic train --local-server` composes them): it watches the model
for `lend_idle_threads` and refuses `max_lag=0`, as for the bare source. Both looked only at
the source given, so a wrapped lending source failed its first step telling the user to give
it to a Trainer, and a wrapped one with max_lag=0 dropped every second batch as stale."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from training_fakes import ListSource, WeightedNLL, mixed_items, tiny_llama

from ludic.recipes.training import log_samples
from ludic.training import PrefetchBatchSource, RLAlgorithm, Trainer, TrainerConfig
from ludic.training.credit import MonteCarloReturn


def algorithm() -> RLAlgorithm:
    return RLAlgorithm(name="nll", credit_assigner=MonteCarloReturn(), loss=WeightedNLL())


def test_a_wrapped_lending_source_trains_a_step(tmp_path: Path) -> None:
    prefetch = PrefetchBatchSource(ListSource([mixed_items(2)]), lend_idle_threads=2)
    source = log_samples(prefetch, tmp_path)
    trainer = Trainer(tiny_llama(), algorithm(), source, TrainerConfig(max_lag=1))
    try:
        metrics = asyncio.run(trainer.train_step())
        assert metrics["num_samples_in"] == 2
        assert "batch/prefetch_lent_seconds" in metrics
    finally:
        trainer.close()
        prefetch.close()


def test_a_wrapped_prefetch_with_max_lag_0_is_refused(tmp_path: Path) -> None:
    inner = ListSource([mixed_items(2)])
    prefetch = PrefetchBatchSource(inner)
    try:
        with pytest.raises(ValueError, match=r"max_lag=0\) with a PrefetchBatchSource"):
            Trainer(
                tiny_llama(), algorithm(), log_samples(prefetch, tmp_path), TrainerConfig(max_lag=0)
            )
        assert inner.position == 0
    finally:
        prefetch.close()


def test_a_source_without_prefetch_has_none() -> None:
    from ludic.training.batching.prefetch import prefetch_inside

    class Cyclic:  # a `.source` that leads back to itself ends the walk
        def __init__(self) -> None:
            self.source = self

    assert prefetch_inside(ListSource([mixed_items(2)])) is None
    assert prefetch_inside(Cyclic()) is None
