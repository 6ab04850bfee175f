"""`run_eval(progress=True)` (what `ludic eval` runs by default) calls the engine once per
episode to move its bar; the engine's once-per-batch lines are still said once: one traceback
(the first failure's) and one "every one of the N episodes failed" line naming all N. Each
episode printed its own traceback, labelled "the batch's first failure", and its own "every
one of the 1 episodes in this batch failed"."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from eval_fakes import quiz_engine, quiz_requests

from ludic.eval import run_eval
from ludic.rollouts import ComponentSpec


def broken_requests(n: int) -> list:
    """Requests whose env factory raises (an unknown keyword argument) at every episode."""
    requests = quiz_requests({"A": ["right"] * n})
    return [replace(r, env=ComponentSpec(name="quiz", kwargs={"no_such_arg": 1})) for r in requests]


def engine_lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ludic.rollouts.engine" and r.getMessage().startswith(start)
    ]


@pytest.mark.parametrize("progress", [False, True])
async def test_batch_lines_said_once_with_or_without_the_bar(
    caplog: pytest.LogCaptureFixture, progress: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="ludic.rollouts.engine")
    result = await run_eval(quiz_engine(concurrency=2), broken_requests(4), progress=progress)
    assert [e.failed for e in result.episodes] == [True] * 4
    assert len(engine_lines(caplog, "traceback of episode")) == 1
    all_failed = engine_lines(caplog, "every one of the")
    assert len(all_failed) == 1 and all_failed[0].startswith("every one of the 4 episodes")
    assert len(engine_lines(caplog, "episode A:")) == 4  # each failure still has its line


async def test_the_filter_goes_with_the_evaluation(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ludic.rollouts.engine")
    await run_eval(quiz_engine(), broken_requests(2), progress=True)
    caplog.clear()
    await quiz_engine().run(broken_requests(2))  # a plain batch afterwards logs as before
    assert len(engine_lines(caplog, "traceback of episode")) == 1
    assert len(engine_lines(caplog, "every one of the 2 episodes")) == 1
