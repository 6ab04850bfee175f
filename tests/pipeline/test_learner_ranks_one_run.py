"""Under torchrun each learner rank pins the run of the first sample it reads; ranks that
pinned different runs (two runs' actors on one stream) are refused on every rank alike before
the step trains, in the same gather as the credit check: neither rank sees the other's run as
foreign, so the step would have trained both runs at once."""

from __future__ import annotations

import pytest

from ludic.pipeline.commands import _credit_checked_source
from ludic.pipeline.credit_check import CreditCheck, RankCredit
from ludic.pipeline.stream import SampleStream


async def test_ranks_that_pinned_different_runs_refuse_alike() -> None:
    stream = SampleStream("redis://127.0.0.1:9/0", stream="s", group="g")  # never reached
    source = _credit_checked_source(
        CreditCheck("grpo", quiet=True), stream, batch_size=2, rank=1, world_size=2
    )
    try:
        source.run_check.run = "run-b"
        rank_0 = (RankCredit(held={}, first=None), "run-a")

        def differ(mine: tuple[RankCredit, str | None]) -> list[tuple[RankCredit, str | None]]:
            return [rank_0, mine]

        with pytest.raises(ValueError, match="rank 0 run run-a, rank 1 run run-b") as refused:
            source.check_ranks(differ)
        assert "Give each run its own --stream" in str(refused.value)

        def agree(mine: tuple[RankCredit, str | None]) -> list[tuple[RankCredit, str | None]]:
            return [(rank_0[0], "run-b"), mine]

        source.check_ranks(agree)  # one run: trains

        def unpinned(mine: tuple[RankCredit, str | None]) -> list[tuple[RankCredit, str | None]]:
            return [(rank_0[0], None), mine]  # rank 0 read only unstamped samples so far

        source.check_ranks(unpinned)
    finally:
        await source.aclose()
