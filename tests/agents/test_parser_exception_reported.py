"""A parser that raises makes the reply a parse failure (never a crash), and now says so once
in the log, naming the parser and the exception: before, a parser with a bug that raised on
every reply only showed as parse errors and the penalty in the metrics (`ludic eval` printed
parse_errors/mean and nothing else), so the run trained on the penalty without a word."""

from __future__ import annotations

import logging

import pytest

from ludic._log_once import forget_warnings
from ludic.agents import Agent
from ludic.inference.scripted import ScriptedClient
from ludic.types import ParseResult


def started(agent: Agent) -> Agent:
    agent.reset("system")
    agent.on_env_reset("go", {})
    return agent


def buggy_parser(text: str) -> ParseResult:
    raise KeyError("my parser has a bug")


def other_buggy_parser(text: str) -> ParseResult:
    raise IndexError("list index out of range")


async def test_a_raising_parser_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    forget_warnings()
    agent = started(Agent(ScriptedClient(["a", "b", "c"]), parser=buggy_parser))
    with caplog.at_level(logging.WARNING, logger="ludic.agents.base"):
        for _ in range(3):
            act = await agent.act(turn_id="t")
            assert act.parse_result.action is None
    reports = [r for r in caplog.records if "buggy_parser raised KeyError" in r.getMessage()]
    assert len(reports) == 1
    assert "'my parser has a bug'" in reports[0].getMessage()
    assert "return ParseResult(action=None" in reports[0].getMessage()


async def test_another_parser_is_reported_too(caplog: pytest.LogCaptureFixture) -> None:
    agent = started(Agent(ScriptedClient(["a"]), parser=other_buggy_parser))
    with caplog.at_level(logging.WARNING, logger="ludic.agents.base"):
        await agent.act(turn_id="t")
    assert any("other_buggy_parser raised IndexError" in r.getMessage() for r in caplog.records)
