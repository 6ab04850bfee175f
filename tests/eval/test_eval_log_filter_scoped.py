"""`run_eval(progress=True)` says the engine's per-batch failure lines once for its own
episodes, and leaves alone those of another engine run in the same process (a training draw
on a prefetch thread beside an evaluation): its log filter dropped them too."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest
from eval_fakes import quiz_engine, quiz_requests

from ludic.eval import run_eval
from ludic.rollouts import ComponentSpec, RolloutRequest


def _broken(n: int, tag: str) -> list[RolloutRequest]:
    requests = quiz_requests({tag: ["right"] * n})
    return [replace(r, env=ComponentSpec(name="quiz", kwargs={"no_such_arg": 1})) for r in requests]


async def test_another_runs_failures_are_still_said(caplog: pytest.LogCaptureFixture) -> None:
    async def training_batch() -> None:
        await asyncio.sleep(0)  # while the evaluation runs
        await quiz_engine().run(_broken(3, "T"))

    with caplog.at_level(logging.WARNING, logger="ludic.rollouts.engine"):
        evaluation = run_eval(quiz_engine(concurrency=1), _broken(20, "E"), progress=True)
        await asyncio.gather(evaluation, training_batch())
    said = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("every one of the 3 episodes") for line in said), said
