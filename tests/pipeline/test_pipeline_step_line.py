"""The learner's step and closing lines under several ranks, through the functions `ludic
learner` calls after each step and at the end (`report_step`, `report_done`): the sample counts
and lags are all ranks' (the step's `num_samples` and `policy_lag/*` as the Trainer sums them
over ranks, the closing totals through the runtime's all-reduce), what is rank 0's alone says
so, only rank 0 logs, and the run stops once every rank's batch came back empty."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from ludic.pipeline.learner_report import TOTAL_KEYS, report_done, report_step
from ludic.pipeline.source import PipelineBatchSource

METRICS = {"num_samples": 32.0, "policy_lag/max": 2.0, "reward_mean": 0.5, "loss": 0.1}
LOGGER = "ludic.pipeline.learner_report"


class _TwoRanks:
    """A runtime of 2 ranks where the other rank holds the same numbers as this one."""

    world_size = 2

    def __init__(self) -> None:
        self.reduced: list[list[float]] = []

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        self.reduced.append(list(values))
        return [2 * v for v in values]


def _learner(runtime: object, *, rank: int = 0, timed_out: bool = False) -> tuple[object, object]:
    trainer = SimpleNamespace(step=3, runtime=runtime, checkpoints=None)
    source = SimpleNamespace(
        rank=rank,
        timed_out=timed_out,
        timed_out_dropped=0,
        totals=Counter(samples=16, redelivered=2),
        max_wait_s=30.0,
    )
    source.exhausted_line = PipelineBatchSource.exhausted_line.__get__(source)
    return trainer, source


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_two_ranks_count_both_ranks_samples_and_label_rank_0s_numbers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = _TwoRanks()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        stop = report_step(*_learner(runtime), METRICS)
    [line] = _lines(caplog)
    assert line.startswith("learner step 3: 32 samples on 2 ranks (policy lag max 2), mean")
    assert "mean reward per sample on rank 0 +0.500" in line
    assert stop is None  # this rank's timed_out and stale drops while timing out; the
    assert runtime.reduced == [[0.0, 0.0]]  # Trainer's num_samples is all ranks' already


def test_one_rank_says_nothing_about_ranks_and_reduces_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report_step(*_learner(SimpleNamespace(world_size=1)), METRICS)
    [line] = _lines(caplog)
    assert line.startswith("learner step 3: 32 samples (policy lag max 2), mean reward per")
    assert "rank" not in line


def test_only_rank_0_logs_and_every_rank_empty_stops_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = _TwoRanks()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        stop = report_step(*_learner(runtime, rank=1, timed_out=True), {"num_samples": 0.0})
        report_done(*_learner(runtime, rank=1))
    # both ranks (this one twice over) came back empty
    assert stop == "no samples arrived for 30.0s on any of the 2 ranks"
    assert not _lines(caplog) and len(runtime.reduced) == 2  # the collectives still ran


def test_the_done_line_names_the_ranks_its_totals_cover(caplog: pytest.LogCaptureFixture) -> None:
    runtime = _TwoRanks()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        report_done(*_learner(runtime))
        report_done(*_learner(SimpleNamespace(world_size=1)))
    two, one = _lines(caplog)
    assert two.startswith("learner done at step 3: 32 samples read on 2 ranks, 4 redelivered (")
    assert one.startswith("learner done at step 3: 16 samples read, 2 redelivered (read but ")
    assert runtime.reduced == [[16.0, 2.0] + [0.0] * (len(TOTAL_KEYS) - 2)]
