"""Who is to blame for an external tool handler's failure decides where it goes. A handler that
returns the wrong shape (no list, or items that are not ToolResult) is its author's bug: the
episode fails naming the handler, what it returned and what it should return, and the batch
goes on (the model used to read it as its tool's answer). A sandbox that never started inside
the handler is the host's failure: the episode fails too. A handler that raises stays an error
result the model reads, logged once naming the handler."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from ludic._log_once import forget_warnings
from ludic.agents import ToolAgent
from ludic.envs import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol, ToolCallContext
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.sandbox import SandboxStartError
from ludic.types import Info, Rollout, StepOutcome, ToolCall, ToolResult

EXTERNAL_CALL = '<tool_call>{"name": "ask", "arguments": {"question": "q?"}}</tool_call>'


class OneStepEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "ask, then answer", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=1.0, terminated=True)


def ask(question: str) -> str:
    """Ask the environment a question.

    Args:
        question: what to ask
    """
    raise AssertionError("external tools are handled by the protocol")


def answering(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
    return [ToolResult(tool_call_id=c.id, name=c.name, content="42") for c in calls]


def bare_answers(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[str]:
    return ["42" for _ in calls]


def host_down(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
    raise SandboxStartError("the sandbox did not start: bwrap: Creating new namespace failed")


def offline(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
    raise ConnectionError("the search service is down")


HANDLERS: dict[str, Callable[..., Any]] = {
    "answering": answering,
    "bare_answers": bare_answers,
    "host_down": host_down,
    "offline": offline,
}


def protocol(handler: str) -> SingleAgentProtocol:
    agent = ToolAgent(
        ScriptedClient([EXTERNAL_CALL, "<move>a</move>"]),
        external_tools=[ask],
        parser=xml_tag_parser("move"),
    )
    return SingleAgentProtocol(agent, external_tool_handler=HANDLERS[handler], max_steps=1)


async def run_batch(*handlers: str) -> list[Rollout]:
    engine = RolloutEngine(env_registry={"one": OneStepEnv}, protocol_registry={"p": protocol})
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="one"), protocol=ComponentSpec(name="p", kwargs={"handler": h})
        )
        for h in handlers
    ]
    return await engine.run(requests)


async def test_a_handler_returning_the_wrong_shape_fails_its_episode_and_the_batch_goes_on() -> (
    None
):
    fine, wrong = await run_batch("answering", "bare_answers")
    assert not fine.failed and fine.agent_steps[0].tool_results[0].content == "42"
    assert wrong.failed and wrong.meta["error_type"] == "ToolResultTypeError"
    assert wrong.meta["error"] == (
        "external_tool_handler bare_answers returned a list whose item 0 is '42' (a str), not "
        "a ToolResult: return one ToolResult per call (ludic.agents.tool_results_from_json "
        "pairs plain outputs with their calls)"
    )


async def test_a_sandbox_that_never_started_in_a_handler_fails_its_episode() -> None:
    fine, host_failed = await run_batch("answering", "host_down")
    assert not fine.failed
    assert host_failed.failed and host_failed.meta["error_type"] == "SandboxStartError"
    assert host_failed.meta["error"] == (
        "external_tool_handler host_down: the sandbox did not start: bwrap: Creating new "
        "namespace failed"
    )


async def test_a_raising_handler_is_an_error_result_logged_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forget_warnings()  # each distinct failure is logged once
    with caplog.at_level(logging.WARNING, logger="ludic.interaction.acting"):
        (rollout,) = await run_batch("offline")
    assert not rollout.failed
    (result,) = rollout.agent_steps[0].tool_results
    assert (
        result.is_error and result.content == "Error: ConnectionError: the search service is down"
    )
    assert "external_tool_handler offline failed: ConnectionError" in caplog.text
