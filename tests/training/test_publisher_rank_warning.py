"""Under FSDP only rank 0 publishes (it holds the gathered weights): a publisher given on
another rank too is never called there, and that rank says so instead of leaving an embedded
engine it feeds on its first weights in silence."""

from __future__ import annotations

from typing import Any

import pytest
from training_fakes import PeerRuntime

from ludic.training.trainer_guards import check_publisher_rank


class Recorder:
    def publish(self, weights: Any, *, version: int) -> None:
        raise AssertionError("not called here")


def test_a_publisher_on_a_rank_other_than_0_is_named_as_never_called(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = PeerRuntime(rank=1, peer_cause=True)  # rank 0 holds a publisher too
    with caplog.at_level("WARNING", logger="ludic.training.trainer_guards"):
        assert check_publisher_rank(runtime, Recorder())
    [record] = caplog.records
    assert "publisher given on rank 1 is never called" in record.getMessage()
    assert "publisher on rank 0 only" in record.getMessage()
    assert runtime.calls == ["all_gather_object"]


def test_rank_0_holding_the_publisher_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    runtime = PeerRuntime(rank=0, peer_cause=True)  # rank 1 holds a publisher too
    with caplog.at_level("WARNING", logger="ludic.training.trainer_guards"):
        assert check_publisher_rank(runtime, Recorder())
    assert caplog.records == []
    assert runtime.calls == ["all_gather_object"]
