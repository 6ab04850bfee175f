"""Fuzz: malformed completions through whole episodes (single agent with internal and external
tools, and a two-player game) never raise, and every rollout is well-formed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interaction_fakes import CoinDuelEnv, CountingEnv

from ludic.agents import Agent, ToolAgent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol, ToolCallContext
from ludic.parsers import xml_tag_parser
from ludic.types import EnvironmentStep, Rollout, ToolCall, ToolResult

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    '{"name": "ask", "arguments": {"q": "?"}}',
    '{"name": "ask"}',
    '{"name": 7}',
    "<move>",
    "</move>",
    "1",
    "2",
    "é🤖",
]
completions = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=10).map("".join)
replies = st.lists(
    st.tuples(completions, st.sampled_from(["stop", "length"])), min_size=1, max_size=5
)


def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def ask(q: str) -> str:
    """Ask."""
    raise AssertionError("external")


async def answer(calls: Sequence[ToolCall], ctx: ToolCallContext) -> list[ToolResult]:
    return [ToolResult(tool_call_id=c.id, name=c.name, content="42") for c in calls]


def check(rollout: Rollout, max_steps: int) -> None:
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))) == rollout
    assert len(rollout.env_steps) <= max_steps + 1
    ids = {s.id for s in rollout.agent_steps}
    for step in rollout.env_steps:
        assert set(step.agent_step_ids) <= ids
    ended = rollout.env_steps[-1] if rollout.env_steps else None
    if ended is not None and not ended.terminated:
        assert ended.truncated and rollout.meta["episode_truncated"] is True
    for turn in rollout.turns():
        if turn.agent_steps:
            assert isinstance(turn.last_step, EnvironmentStep)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies, replies)
def test_fuzzed_episodes_never_raise(
    script_a: list[tuple[str, str]], script_b: list[tuple[str, str]]
) -> None:
    parser = xml_tag_parser("move")

    async def run() -> None:
        agent = ToolAgent(
            ScriptedClient(list(script_a)),
            tools=[add],
            external_tools=[ask],
            parser=parser,
            max_inner_steps=2,
        )
        protocol = SingleAgentProtocol(
            agent, max_steps=3, external_tool_handler=answer, max_external_calls=1
        )
        (rollout,) = await protocol.run(CountingEnv(length=2))
        check(rollout, 3)
        duel = MultiAgentProtocol(
            {
                "first": Agent(ScriptedClient(list(script_a)), parser=parser),
                "second": ToolAgent(ScriptedClient(list(script_b)), tools=[add], parser=parser),
            },
            max_steps=4,
        )
        for r in await duel.run(CoinDuelEnv(coins=3)):
            check(r, 4)

    asyncio.run(run())
