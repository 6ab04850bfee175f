"""README walk (walkC), "Decoupled actor and learner over Redis": the README's actor makes
batches of 320 samples (4 problems x 8 episodes x 10 turns of the untrained model), more than
the default --max-backlog of 256, so each one waits for the stream to drain. Its waiting line
said `stream 'ludic:samples' holds 64 undelivered samples, max_backlog (--max-backlog) is 256;
the next batch starts once a learner ... reads them`, leaving the user to wonder why 64 of 256
makes it wait. It now names the last batch's size and the flag that lets the two overlap."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.pipeline.actor import PipelineActor
from ludic.rollouts import RolloutEngine
from ludic.training.credit import GroupNormalizedReturn


class _DrainingStream:
    """The part of a SampleStream the wait reads: undelivered samples a learner drains."""

    stream, group = "ludic:samples", "ludic-learners"

    def __init__(self, backlogs: list[int]) -> None:
        self.backlogs = backlogs

    async def backlog(self) -> int:
        return self.backlogs.pop(0) if len(self.backlogs) > 1 else self.backlogs[0]


def _actor(stream: _DrainingStream) -> PipelineActor:
    engine = RolloutEngine(
        env_registry={},
        protocol_registry={"single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["o"])))},
    )
    return PipelineActor(
        engine=engine,
        stream=stream,  # type: ignore[arg-type]  # only backlog(), stream and group are read
        requests_fn=list,
        credit_assigner=GroupNormalizedReturn(),
        max_backlog=256,
        poll_s=0.0,
    )


def _wait_line(need: int, caplog: pytest.LogCaptureFixture) -> str:
    actor = _actor(_DrainingStream([64, 64, 0]))
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.actor"):
        asyncio.run(actor._wait_for_room(need))
    lines = [r.getMessage() for r in caplog.records if "waits for the learner" in r.getMessage()]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_batch_larger_than_the_backlog_says_it_waits_for_a_drained_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = _wait_line(320, caplog)
    assert "holds 64 undelivered samples, max_backlog (--max-backlog) is 256" in line, line
    assert "the last batch held 320 samples, more than --max-backlog alone" in line, line
    assert "has read them all (raise --max-backlog to about twice the batch, 640," in line, line


def test_a_batch_that_fits_beside_some_keeps_the_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = _wait_line(200, caplog)
    assert line.endswith(
        "; the next batch starts once a learner of group 'ludic-learners' reads them"
    ), line
