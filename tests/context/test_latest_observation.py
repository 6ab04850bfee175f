"""LatestObservationContext: system prompt + latest observation (+ the latest failed reply)."""

from __future__ import annotations

import asyncio

from ludic.agents import Agent
from ludic.context.latest_observation import LatestObservationContext
from ludic.envs import TicTacToeEnv
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.types import ToolResult

SYSTEM = {"role": "system", "content": "sys"}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_prompt_is_system_plus_latest_observation() -> None:
    ctx = LatestObservationContext(system_prompt="sys")
    ctx.reset()
    ctx.on_env_reset("obs0", {})
    assert ctx.on_before_act() == [SYSTEM, user("obs0")]
    ctx.on_after_act(assistant("a0"))
    ctx.on_after_step("obs1", {})
    assert ctx.on_before_act() == [SYSTEM, user("obs1")]
    # The history is kept in full; only the prompt forgets.
    assert ctx.messages == [SYSTEM, user("obs0"), assistant("a0"), user("obs1")]


def test_tool_loop_of_the_current_turn_stays_visible() -> None:
    ctx = LatestObservationContext()
    ctx.reset()
    ctx.on_env_reset("obs0", {})
    call = {"role": "assistant", "content": "", "tool_calls": []}
    ctx.on_after_act(call)
    ctx.on_tool_results([ToolResult(tool_call_id="c", name="f", content="42")])
    prompt = ctx.on_before_act()
    assert [m["role"] for m in prompt] == ["user", "assistant", "tool"]


def test_parse_failure_shows_only_the_latest_failed_reply() -> None:
    ctx = LatestObservationContext(system_prompt="sys")
    ctx.reset()
    ctx.on_env_reset("board", {})
    failure = {"parse_error": True, "synthetic": True}
    ctx.on_after_act(assistant("bad1"))
    ctx.on_after_step("feedback1", failure)
    assert ctx.on_before_act() == [SYSTEM, user("board"), assistant("bad1"), user("feedback1")]
    ctx.on_after_act(assistant("bad2"))
    ctx.on_after_step("feedback2", failure)
    assert ctx.on_before_act() == [SYSTEM, user("board"), assistant("bad2"), user("feedback2")]
    ctx.on_after_act(assistant("<move>5</move>"))
    ctx.on_after_step("board2", {})
    assert ctx.on_before_act() == [SYSTEM, user("board2")]


def test_no_next_observation_changes_nothing_and_reset_forgets() -> None:
    ctx = LatestObservationContext()
    ctx.reset("first")
    ctx.on_env_reset("obs0", {})
    ctx.on_after_act(assistant("a0"))
    ctx.on_after_step(None, {})
    assert ctx.on_before_act() == [
        {"role": "system", "content": "first"},
        user("obs0"),
        assistant("a0"),
    ]
    ctx.reset("")
    ctx.on_env_reset("fresh", {})
    assert ctx.on_before_act() == [user("fresh")]


def test_prompts_stay_short_in_a_real_episode() -> None:
    replies = ["garbage", "<move>5</move>", "nope", "<move>1</move>", "<move>9</move>"]
    client = ScriptedClient(replies + ["<move>3</move>"] * 5)
    agent = Agent(client, context=LatestObservationContext(), parser=xml_tag_parser("move"))
    protocol = SingleAgentProtocol(agent, max_steps=12)
    env = TicTacToeEnv(opponent="minimax")
    asyncio.run(protocol.run(env, env_seed=0))
    sizes = [len(r.messages) for r in client.requests]
    assert max(sizes) <= 4  # system, board, and at most one failed reply with its feedback
    assert sizes[:2] == [2, 4]  # the retry after "garbage" sees it and the feedback
