"""The pipeline learner's batch source is a `RankCheckedSource`: the Trainer calls its
`check_ranks` right after each batch is fetched, before the optimizer step, and it compares the
ranks' first credit records there (`CreditCheck.say_held`), so actors that disagree and whose
samples reached only different ranks are refused before that step trains, not one step late
(the Trainer under torchrun: tests/training/test_fsdp_credit_ranks.py)."""

from __future__ import annotations

import dataclasses

import pytest
from pipeline_fakes import sample

from ludic.pipeline.commands import _credit_checked_source
from ludic.pipeline.credit_check import CreditCheck, CreditMismatchError, RankCredit, credit_record
from ludic.pipeline.stream import SampleStream
from ludic.recipes.algorithms import GiGPOOptions
from ludic.training.parallel import RankCheckedSource


def _record(gamma: float) -> dict[str, object]:
    return credit_record("gigpo", GiGPOOptions(gamma=gamma))


async def test_the_learners_source_compares_the_ranks_first_records() -> None:
    check = CreditCheck("gigpo", quiet=True)
    stream = SampleStream("redis://127.0.0.1:9/0", stream="s", group="g")  # never reached
    source = _credit_checked_source(check, stream, batch_size=2, rank=1, world_size=2)
    try:
        assert isinstance(source, RankCheckedSource)
        assert source.check_sample is check  # each sample it reads is checked as it arrives
        check(dataclasses.replace(sample(), meta={"actor_id": "g1", "credit": _record(0.9)}))
        rank_0 = RankCredit(held={}, first=(_record(0.95), "g0"))
        shared: list[RankCredit] = []

        def all_gather(mine: tuple[RankCredit, str | None]) -> list[tuple[RankCredit, str | None]]:
            shared.append(mine[0])  # with the run this rank pinned (none here)
            return [(rank_0, None), mine]

        with pytest.raises(CreditMismatchError, match="'g0' \\(read by learner rank 0\\)"):
            source.check_ranks(all_gather)
        assert [share.first for share in shared] == [(_record(0.9), "g1")]  # its own, once
    finally:
        await source.aclose()
