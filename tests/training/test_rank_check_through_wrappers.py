"""The Trainer's cross-rank batch check (`check_batch_together`) reaches a `RankCheckedSource`
under any wrapper with a `.source` (`log_samples`, a context-overflow watch, a prefetch): it
looked only at the outermost source, so a refusal under `log_samples` never ran and the step
trained."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ludic.recipes.training import log_samples
from ludic.training.batching.prefetch import PrefetchBatchSource
from ludic.training.batching.types import SAWBatch
from ludic.training.parallel import LocalRuntime, check_batch_together


class Refusing:
    def __init__(self) -> None:
        self.calls = 0

    async def next_batch(self) -> SAWBatch:
        return SAWBatch(items=[])

    def check_ranks(self, all_gather: Callable[[Any], list[Any]]) -> None:
        self.calls += 1
        all_gather("mine")
        raise ValueError("the ranks disagree")


@pytest.mark.parametrize("wrapper", ["log_samples", "prefetch_in_log_samples"])
async def test_a_wrapped_sources_check_runs(wrapper: str, tmp_path: Path) -> None:
    inner = Refusing()
    source: Any = inner
    if wrapper == "prefetch_in_log_samples":
        source = PrefetchBatchSource(source)
    source = log_samples(source, tmp_path)
    await source.next_batch()
    with pytest.raises(ValueError, match="the ranks disagree"):
        check_batch_together(LocalRuntime(), source, "checking the batch of step 1")
    assert inner.calls == 1
    if hasattr(source, "aclose"):
        await source.aclose()
