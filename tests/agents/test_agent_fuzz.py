"""Fuzz: random and malformed completions through Agent, ToolAgent and ReActAgent never raise,
and every act ends in a well-formed, JSON round-trippable record."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ludic.agents import Agent, ReActAgent, ToolAgent
from ludic.agents.base import AgentAct
from ludic.inference.scripted import ScriptedClient
from ludic.parsers import boxed_parser, compose_parsers, think_prefix_parser, xml_tag_parser
from ludic.types import AgentStep


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def shout(text: str, times: int = 1) -> str:
    """Shout."""
    return text.upper() * times


def handoff(task: str) -> str:
    """External."""
    raise AssertionError("never run by the agent")


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    '{"name": "shout", "arguments": {"text": "é", "times": 2}}',
    '{"name": "handoff", "arguments": {"task": "x"}}',
    '{"name": "add", "arguments": {"a": "1"}}',
    '{"name": "nope"}',
    '{"name": ',
    "[" * 50,
    "9" * 40,
    "<think>",
    "</think>",
    "<move>",
    "</move>",
    "\\boxed{",
    "}",
    "\x00",
    "🤖",
    "\n",
]
completions = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=12).map("".join)
replies = st.tuples(completions, st.sampled_from(["stop", "length", "tool_calls"]))

PARSER = compose_parsers(think_prefix_parser(require=False), xml_tag_parser("move"))


def agents(client: ScriptedClient) -> list[Agent]:
    return [
        Agent(client, parser=PARSER),
        Agent(client, parser=boxed_parser(), reject_incomplete_completions=False),
        ToolAgent(client, tools=[add, shout], external_tools=[handoff], max_inner_steps=3),
        ReActAgent(client, tools=[add, shout], parser=PARSER, max_inner_steps=2),
    ]


def check(act: AgentAct) -> None:
    assert act.steps
    for step in act.steps:
        assert AgentStep.from_dict(json.loads(json.dumps(step.to_dict()))) == step
        if step.action_target in ("internal", "external"):
            assert step.parse_result is None
            assert len(step.tool_results) <= len(step.tool_calls)
    final = act.final_step
    if act.external_calls:
        assert final.action_target == "external" and act.parse_result is None
    else:
        assert final.action_target == "env" and act.parse_result is not None
        assert final.parse_result == act.parse_result
        if act.action is None:
            assert final.info["parse_error"] is True and act.parse_result.obs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(replies, min_size=1, max_size=4))
def test_fuzzed_completions_never_crash_an_agent(script: list[tuple[str, str]]) -> None:
    async def run() -> None:
        for agent in agents(ScriptedClient(list(script))):
            agent.reset(None)
            agent.on_env_reset("obs", {})
            for turn in range(2):
                check(await agent.act(turn_id=f"t{turn}"))

    asyncio.run(run())
