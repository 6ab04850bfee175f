"""ContextEditingAgent: delete / summarise tools, the step that records an edit, and the
rewritten prompt the next call sees."""

from __future__ import annotations

import pytest

import ludic.rollouts
from ludic.agents.context_editing import (
    CONTEXT_EDITS_KEY,
    SNAPSHOT_INDEX_KEY,
    SNAPSHOT_REWARD_KEY,
    ContextEditingAgent,
    snapshot_tokens,
)
from ludic.agents.tool_agent import ToolAgent
from ludic.context import FullDialog
from ludic.context.editing import EditableContext
from ludic.inference.scripted import ScriptedClient, hermes_tool_call
from ludic.types import AgentStep


def tool_call(name: str, **arguments: object) -> str:
    return hermes_tool_call({"name": name, "arguments": arguments})


def started(agent: ToolAgent, *observations: str) -> ToolAgent:
    """Reset and feed: obs0 (#1); then per later observation a reply 'mv' and the obs."""
    agent.reset("sys")
    agent.on_env_reset(observations[0], {})
    for obs in observations[1:]:
        agent.context.on_after_act({"role": "assistant", "content": "mv"})
        agent.on_after_step(obs, {})
    return agent


async def test_delete_tool_records_the_edit_on_the_step_that_asked_for_it() -> None:
    client = ScriptedClient([tool_call("delete_context", message_ids=[1]), "next"])
    agent = ContextEditingAgent(client, snapshot_reward=lambda step: -0.5, instructions=None)
    started(agent, "obs0", "obs1")  # #1 obs0, #2 mv, #3 obs1
    act = await agent.act(turn_id="t")
    edit_step, final = act.steps
    assert edit_step.action_target == "internal" and final.action_target == "env"
    assert act.action == "next"
    (result,) = edit_step.tool_results
    assert not result.is_error and result.content == "Removed #1, #2. 3 messages remain."
    (edit,) = edit_step.info[CONTEXT_EDITS_KEY]
    assert edit["removed_ids"] == [1, 2] and edit["view_before"] == [0, 1, 2, 3, 4]
    assert edit_step.info[SNAPSHOT_INDEX_KEY] == 0
    assert edit_step.info[SNAPSHOT_REWARD_KEY] == -0.5
    assert CONTEXT_EDITS_KEY not in final.info and SNAPSHOT_REWARD_KEY not in final.info
    # The second call's prompt no longer holds #1/#2: it does not extend the first sequence.
    first, second = (s.trace for s in act.steps)
    assert first is not None and second is not None
    seq = first.prompt_token_ids + first.completion_token_ids
    assert second.prompt_token_ids[: len(seq)] != seq
    assert [m["content"] for m in final.prompt_messages][:2] == ["sys", "[#3] obs1"]


async def test_summarize_tool_and_snapshot_indices_count_edit_steps() -> None:
    client = ScriptedClient(
        [
            tool_call("summarize_context", message_ids=[1], summary="code 4"),
            tool_call("delete_context", message_ids=[3]),
            "answer 4",
        ]
    )
    agent = ContextEditingAgent(client, instructions=None)
    started(agent, "obs0", "obs1", "obs2")  # obs #1 #3 #5, replies #2 #4
    act = await agent.act(turn_id="t")
    assert [s.info.get(SNAPSHOT_INDEX_KEY) for s in act.steps] == [0, 1, None]
    assert [s.info.get(SNAPSHOT_REWARD_KEY) for s in act.steps] == [0.0, 0.0, None]
    prompt = [m["content"] for m in act.steps[-1].prompt_messages]
    assert prompt[1] == "[#7] Summary of #1, #2: code 4"
    assert "[#3] obs1" not in prompt and "[#5] obs2" in prompt
    agent.reset(None)  # indices restart each episode
    assert agent.editable.edits == []


async def test_a_refused_edit_is_a_tool_error_and_no_snapshot() -> None:
    client = ScriptedClient([tool_call("delete_context", message_ids=[0, 99]), "next"])
    agent = ContextEditingAgent(client, instructions=None)
    started(agent, "obs0")
    act = await agent.act(turn_id="t")
    (result,) = act.steps[0].tool_results
    assert result.is_error
    assert "system prompt" in result.content and "#99 does not exist" in result.content
    assert all(CONTEXT_EDITS_KEY not in s.info for s in act.steps)
    # Nothing changed, so the second call extends the first (one append-only sequence).
    first, second = (s.trace for s in act.steps)
    assert first is not None and second is not None
    seq = first.prompt_token_ids + first.completion_token_ids
    assert second.prompt_token_ids[: len(seq)] == seq


async def test_snapshot_reward_sees_the_edit_step_with_its_trace() -> None:
    seen: list[AgentStep] = []

    def reward(step: AgentStep) -> float:
        seen.append(step)
        return -snapshot_tokens(step) / 1000

    client = ScriptedClient([tool_call("delete_context", message_ids=[1]), "next"])
    agent = ContextEditingAgent(client, snapshot_reward=reward, instructions=None)
    started(agent, "obs0", "obs1")
    act = await agent.act(turn_id="t")
    (step,) = seen
    assert step.trace is not None and step.info[CONTEXT_EDITS_KEY]
    n = len(step.trace.prompt_token_ids) + len(step.trace.completion_token_ids)
    assert act.steps[0].info[SNAPSHOT_REWARD_KEY] == pytest.approx(-n / 1000)


async def test_seed_002_tool_name_and_tool_schemas() -> None:
    client = ScriptedClient([tool_call("deleteContext", message_ids=[1]), "x"])
    agent = ContextEditingAgent(client, delete_tool_name="deleteContext", summarize_tool=False)
    assert sorted(agent.tools) == ["deleteContext"]
    params = agent.tools["deleteContext"].parameters
    assert params["properties"]["message_ids"]["type"] == "array"
    assert params["properties"]["message_ids"]["items"] == {"type": "integer"}
    started(agent, "obs0")
    act = await agent.act(turn_id="t")
    assert act.steps[0].info[CONTEXT_EDITS_KEY][0]["removed_ids"] == [1]


def test_instructions_join_the_system_prompt() -> None:
    agent = ContextEditingAgent(ScriptedClient(["x"]), system_prompt="Play.")
    agent.reset(None)
    system = agent.context.on_before_act()[0]["content"]
    assert system.startswith("Play.\n\n") and "delete_context(message_ids)" in system
    assert "summarize_context(message_ids, summary)" in system
    bare = ContextEditingAgent(ScriptedClient(["x"]), system_prompt="Play.", instructions=None)
    bare.reset(None)
    assert bare.context.on_before_act()[0]["content"] == "Play."


def test_wrong_context_and_name_clash_are_refused() -> None:
    with pytest.raises(TypeError, match="EditableContext"):
        ContextEditingAgent(ScriptedClient(["x"]), context=FullDialog())

    def delete_context(message_ids: list[int]) -> str:
        """Mine."""
        return ""

    with pytest.raises(ValueError, match="name of a context tool"):
        ContextEditingAgent(ScriptedClient(["x"]), tools=[delete_context])


async def test_without_edits_it_prompts_exactly_like_a_tool_agent() -> None:
    replies = ["a", "b"]
    plain = ToolAgent(ScriptedClient(replies), context=FullDialog())
    editing = ContextEditingAgent(
        ScriptedClient(replies), context=EditableContext(show_ids=False), instructions=None
    )
    for agent in (plain, editing):
        started(agent, "obs0", "obs1")
    a, b = await plain.act(turn_id="t"), await editing.act(turn_id="t")
    assert [s.prompt_messages for s in a.steps] == [s.prompt_messages for s in b.steps]
    assert [s.trace for s in a.steps] == [s.trace for s in b.steps]
    assert [s.info for s in a.steps] == [s.info for s in b.steps]


def test_snapshot_reward_key_matches_the_sample_builder() -> None:
    assert SNAPSHOT_REWARD_KEY == ludic.rollouts.SNAPSHOT_REWARD_KEY
