"""Under FSDP only rank 0 publishes (it holds the gathered weights): a publisher given on
another rank too is never called there, and that rank says so instead of leaving an embedded
engine it feeds on its first weights in silence."""

from __future__ import annotations

from typing import Any

import pytest

from ludic.training import LocalRuntime
from ludic.training.trainer_guards import check_publisher_rank


class RankOfTwo(LocalRuntime):
    """This process as rank `rank` of 2, where every rank holds a publisher."""

    def __init__(self, rank: int) -> None:
        super().__init__("cpu")
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return 2

    @property
    def is_main(self) -> bool:
        return self._rank == 0

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj, obj]


class Recorder:
    def publish(self, weights: Any, *, version: int) -> None:
        raise AssertionError("not called here")


def test_a_publisher_on_a_rank_other_than_0_is_named_as_never_called(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="ludic.training.trainer_guards"):
        assert check_publisher_rank(RankOfTwo(rank=1), Recorder())
    [record] = caplog.records
    assert "publisher given on rank 1 is never called" in record.getMessage()
    assert "publisher on rank 0 only" in record.getMessage()


def test_rank_0_holding_the_publisher_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="ludic.training.trainer_guards"):
        assert check_publisher_rank(RankOfTwo(rank=0), Recorder())
    assert caplog.records == []
