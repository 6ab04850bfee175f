"""README "## Training": without a `seed_sequencer`, `RolloutBatchSource` warns once when a
batch replays the previous batch's unseeded requests, naming the fix. With one problem replayed
the line names it alone: it said "(and 0 more)"."""

from __future__ import annotations

import logging

import pytest

from ludic.rollouts import ComponentSpec, GRPORequestStrategy, RolloutEngine, RolloutRequest
from ludic.training import GroupNormalizedReturn, RolloutBatchSource


def _source(requests: list[RolloutRequest]) -> RolloutBatchSource:
    return RolloutBatchSource(
        engine=RolloutEngine(env_registry={}, protocol_registry={}),
        requests_fn=lambda: requests,
        credit_assigner=GroupNormalizedReturn(),
        strategy=GRPORequestStrategy(group_size=2),
    )


def _problem() -> RolloutRequest:
    return RolloutRequest(env=ComponentSpec(name="tictactoe"), protocol=ComponentSpec(name="p"))


def _replay_lines(requests: list[RolloutRequest], caplog: pytest.LogCaptureFixture) -> list[str]:
    source = _source(requests)
    with caplog.at_level(logging.WARNING, logger="ludic.training.batching.synced"):
        for _ in range(3):
            source._warn_on_replay(requests)
    return [r.getMessage() for r in caplog.records if "reuses unseeded" in r.getMessage()]


def test_one_replayed_problem_is_named_alone(caplog: pytest.LogCaptureFixture) -> None:
    problem = _problem()
    (line,) = _replay_lines([problem, problem], caplog)
    assert repr(problem.request_id) in line
    assert "more)" not in line
    assert "seed_sequencer=SeedSequencer(run_seed=...)" in line


def test_several_replayed_problems_are_counted(caplog: pytest.LogCaptureFixture) -> None:
    (line,) = _replay_lines([_problem(), _problem(), _problem()], caplog)
    assert "(and 2 more)" in line
