"""`signals_deferred` as every torchrun rank uses it around its part of a save: a save nested in
a deferring one (the Trainer's around `CheckpointManager.save`) defers nothing more, so the
signal waits for the outer save, said once; and with `agree` (the ranks' all-reduce after the
save) a rank the signal did not reach stops with it too, a rank it reached stops once (2 gloo
ranks end to end: test_fsdp_save_signal.py)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from ludic.training.checkpoint_signals import signals_deferred


class Stop(Exception):
    """What the test's handler raises, as the `ludic` command's raises KeyboardInterrupt."""


@pytest.fixture
def handled() -> Iterator[list[int]]:
    """The signals the handler (installed for SIGINT and SIGTERM) was called with."""
    calls: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)
        raise Stop(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield calls
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _no_signal_elsewhere(asked: list[int]) -> Callable[[int], int]:
    """An `agree` of ranks none of which deferred a signal; records what it was asked."""

    def agree(mine: int) -> int:
        asked.append(mine)
        return mine

    return agree


def test_a_nested_save_waits_for_the_outer_one(
    handled: list[int], capfd: pytest.CaptureFixture[str]
) -> None:
    steps: list[str] = []
    with pytest.raises(Stop), signals_deferred("checkpoint outer"):
        with signals_deferred("checkpoint inner"):
            signal.raise_signal(signal.SIGTERM)
            steps.append("inner written")
        steps.append("outer written")  # the inner save's end does not act on it
    assert handled == [signal.SIGTERM] and steps == ["inner written", "outer written"]
    notices = [line for line in capfd.readouterr().err.splitlines() if line.startswith("ludic:")]
    assert notices == [
        "ludic: SIGTERM: finishing the save of checkpoint outer first, then stopping "
        "(Ctrl-C or SIGTERM again stops at once, without this checkpoint)"
    ]


def test_a_rank_the_signal_did_not_reach_stops_with_it_after_the_save(
    handled: list[int], capfd: pytest.CaptureFixture[str]
) -> None:
    asked: list[int] = []

    def agree(mine: int) -> int:  # another rank deferred a SIGTERM
        asked.append(mine)
        return max(mine, signal.SIGTERM)

    with pytest.raises(Stop), signals_deferred("checkpoint c", agree=agree):
        pass
    assert asked == [0] and handled == [signal.SIGTERM]
    assert "ludic: SIGTERM on another rank during the save of checkpoint c: stopping" in (
        capfd.readouterr().err
    )


def test_a_rank_the_signal_reached_stops_once_with_its_own(handled: list[int]) -> None:
    asked: list[int] = []

    def agree(mine: int) -> int:
        asked.append(mine)
        return max(mine, signal.SIGINT)  # the other rank got a Ctrl-C

    with pytest.raises(Stop), signals_deferred("checkpoint c", agree=agree):
        signal.raise_signal(signal.SIGTERM)
    assert asked == [signal.SIGTERM] and handled == [signal.SIGTERM]


def test_without_a_signal_anywhere_nothing_happens(handled: list[int]) -> None:
    asked: list[int] = []
    with signals_deferred("checkpoint c", agree=_no_signal_elsewhere(asked)):
        pass
    assert asked == [0] and handled == []


def test_a_save_that_raised_does_not_meet_the_other_ranks(handled: list[int]) -> None:
    """Its error already stops every rank (`run_on_main`): no collective after it."""
    asked: list[int] = []
    agree = _no_signal_elsewhere(asked)
    with pytest.raises(OSError, match="disk full"), signals_deferred("checkpoint c", agree=agree):
        raise OSError("disk full")
    assert asked == [] and handled == []
