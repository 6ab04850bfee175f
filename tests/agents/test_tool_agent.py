"""ToolAgent and ReActAgent: internal tool loops, error results, external hand-off, caps."""

from __future__ import annotations

import json

import pytest

from ludic.agents import ReActAgent, ToolAgent, tool_results_from_json
from ludic.agents.tools import INVALID_TOOL
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient, hermes_tool_call
from ludic.parsers import xml_tag_parser
from ludic.types import ToolCall


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


async def slow_echo(text: str) -> str:
    """Echo text (async)."""
    return text


def explode() -> str:
    """Always fails."""
    raise ZeroDivisionError("nope")


def ask_human(question: str) -> str:
    """Ask a human (handled by the protocol)."""
    raise AssertionError("external tools never run inside the agent")


def call(name: str, **arguments: object) -> str:
    return hermes_tool_call({"name": name, "arguments": arguments})


def started(agent: ToolAgent) -> ToolAgent:
    agent.reset(None)
    agent.on_env_reset("what is 2+3?", {})
    return agent


async def test_internal_tools_loop_then_final_env_step() -> None:
    client = ScriptedClient(
        [
            "<think>add</think>" + call("add", a=2, b=3),
            call("slow_echo", text="hé"),
            "<move>5</move>",
        ]
    )
    agent = started(
        ToolAgent(client, tools=[add, slow_echo], parser=xml_tag_parser("move"), max_inner_steps=3)
    )
    act = await agent.act(turn_id="t0")
    assert act.action == "5" and act.external_calls == ()
    assert [s.action_target for s in act.steps] == ["internal", "internal", "env"]
    assert [s.loop_index for s in act.steps] == [0, 1, 2]
    assert {s.turn_id for s in act.steps} == {"t0"}
    assert [s.parse_result is None for s in act.steps] == [True, True, False]
    first, second, final = act.steps
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("add", {"a": 2, "b": 3})
    ]
    assert [(r.content, r.is_error) for r in first.tool_results] == [("5", False)]
    assert first.tool_results[0].tool_call_id == first.tool_calls[0].id
    assert first.info["tool_errors"] == 0
    assert second.tool_results[0].content == "hé"
    # Each call has its own trace, and the tool result is in the next prompt.
    traces = [s.trace for s in act.steps]
    assert all(t is not None for t in traces) and len({id(t) for t in traces}) == 3
    tool_msg = {
        "role": "tool",
        "tool_call_id": first.tool_calls[0].id,
        "name": "add",
        "content": "5",
    }
    assert tool_msg in second.prompt_messages and tool_msg not in first.prompt_messages
    assistant = second.prompt_messages[-2]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"] == [first.tool_calls[0].to_message_part()]
    assert assistant["content"] == "<think>add</think>"  # the call lives in tool_calls only
    # Tools were offered to the server in OpenAI format on every call.
    for request in client.requests:
        assert request.tools is not None
        assert [t["function"]["name"] for t in request.tools] == ["add", "slow_echo"]
    assert final.reward == 0.0 and final.parse_result is not None


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (call("nope"), "unknown tool 'nope'"),
        ("<tool_call>{bad json</tool_call>", "tool call is not valid JSON"),
        ('<tool_call>{"name": 3}</tool_call>', 'string "name"'),
        (call("add", a="two", b=3), "argument 'a' must be integer"),
        (call("add", a=1), "missing required argument(s): b"),
        (call("explode"), "ZeroDivisionError: nope"),
    ],
)
async def test_tool_problems_become_error_results_fed_back(reply: str, problem: str) -> None:
    client = ScriptedClient([reply, "<move>ok</move>"])
    agent = started(ToolAgent(client, tools=[add, explode], parser=xml_tag_parser("move")))
    act = await agent.act(turn_id="t")
    assert act.action == "ok"
    first = act.steps[0]
    assert first.action_target == "internal" and first.info["tool_errors"] == 1
    (result,) = first.tool_results
    assert result.is_error and problem in result.content
    if "not valid JSON" in problem or "name" in problem:
        assert first.tool_calls[0].name == INVALID_TOOL
    assert result.to_message() in act.steps[1].prompt_messages


async def test_external_tools_end_the_act_for_the_protocol() -> None:
    client = ScriptedClient([call("add", a=1, b=1) + call("ask_human", question="?")])
    agent = started(ToolAgent(client, tools=[add], external_tools=[ask_human]))
    act = await agent.act(turn_id="t")
    (step,) = act.steps
    assert step.action_target == "external" and step.parse_result is None
    assert act.parse_result is None and act.action is None
    assert [c.name for c in act.external_calls] == ["ask_human"]
    # The internal call in the same reply ran first; its result is already in the context.
    assert [r.content for r in step.tool_results] == ["2"]
    assert agent.context.messages[-1]["role"] == "tool"


async def test_inner_step_cap_is_a_tool_loop_exhausted_parse_failure() -> None:
    client = ScriptedClient([call("add", a=1, b=1)])
    agent = started(ToolAgent(client, tools=[add], max_inner_steps=3))
    act = await agent.act(turn_id="t")
    assert client.calls == 3 and act.action is None
    assert [s.action_target for s in act.steps] == ["internal", "internal", "env"]
    last = act.final_step
    assert last.info["tool_loop_exhausted"] is True and last.info["parse_error"] is True
    assert act.parse_result is not None and last.parse_result == act.parse_result
    assert act.parse_result.obs is not None and "3 model calls" in act.parse_result.obs
    assert last.reward == act.parse_result.reward < 0
    assert last.tool_results[0].content == "2"  # the last call's tools still ran


async def test_cut_off_tool_call_is_rejected_and_not_run() -> None:
    client = ScriptedClient([(call("explode"), "length")])
    agent = started(ToolAgent(client, tools=[explode], reject_incomplete_completions=True))
    act = await agent.act(turn_id="t")
    (step,) = act.steps
    assert step.action_target == "env" and step.tool_calls == () and act.action is None
    assert step.info["incomplete_completion"] is True
    assert "tool_calls" not in agent.context.messages[-1]  # no unanswered tool call


async def test_server_side_tool_calls_are_used_when_present() -> None:
    class ServerParsed:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, request: ChatRequest) -> ChatResponse:
            self.calls += 1
            if self.calls == 1:
                tc = ToolCall(id="srv1", name="add", arguments='{"a": 4, "b": 5}')
                return ChatResponse(text="", tool_calls=(tc,), finish_reason="tool_calls")
            return ChatResponse(text="done", finish_reason="stop")

    agent = started(ToolAgent(ServerParsed(), tools=[add]))
    act = await agent.act(turn_id="t")
    assert act.action == "done" and act.steps[0].tool_results[0].content == "9"
    assert act.steps[0].trace is None  # no token ids from this backend


async def test_tool_agent_seeds_are_distinct_per_call() -> None:
    client = ScriptedClient([call("add", a=1, b=2), "x"])
    agent = started(ToolAgent(client, tools=[add], sampling=SamplingConfig(seed=3)))
    await agent.act(turn_id="t0")
    await agent.act(turn_id="t1")
    seeds = [r.sampling.seed for r in client.requests]
    assert len(seeds) == 4 and len(set(seeds)) == 4


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="max_inner_steps"):
        ToolAgent(ScriptedClient(["x"]), max_inner_steps=0)
    with pytest.raises(ValueError, match=r"both internal and external: \['add'\]"):
        ToolAgent(ScriptedClient(["x"]), tools=[add], external_tools=[add])


def test_tool_results_from_json_pairs_outputs_with_calls() -> None:
    calls = [ToolCall(id="a", name="f", arguments="{}"), ToolCall(id="b", name="g", arguments="")]
    results = tool_results_from_json(calls, ["text", {"k": [1]}])
    assert [(r.tool_call_id, r.content) for r in results] == [("a", "text"), ("b", '{"k": [1]}')]
    with pytest.raises(ValueError):
        tool_results_from_json(calls, ["only one"])


async def test_react_agent_prompt_lists_every_tool_with_its_schema() -> None:
    client = ScriptedClient(["<move>1</move>"])
    agent = ReActAgent(client, tools=[add], external_tools=[ask_human], system_prompt="Be good.")
    agent.reset("ignored env prompt")
    system = agent.context.messages[0]["content"]
    assert system.startswith("Be good.\n\n") and "<tool_call>" in system
    assert json.dumps(agent.tools["add"].schema()["function"]) in system
    assert json.dumps(agent.external_tools["ask_human"].schema()["function"]) in system
    bare = ReActAgent(client, tools=[add])
    bare.reset(None)
    assert bare.context.messages[0]["content"].startswith("You can use tools.")
    custom = ReActAgent(client, tools=[add], react_instructions="T: {tools}")
    custom.reset("env")
    assert custom.context.messages[0]["content"].startswith("env\n\nT: {")


async def test_text_parsed_calls_render_once_in_the_next_prompt() -> None:
    from ludic.models import load_tiny_model

    _, tokenizer = load_tiny_model()
    client = ScriptedClient(["Let me add.\n" + call("add", a=2, b=3), "<move>5</move>"])
    agent = started(ToolAgent(client, tools=[add], parser=xml_tag_parser("move")))
    act = await agent.act(turn_id="t0")
    rendered = tokenizer.apply_chat_template(
        list(act.steps[1].prompt_messages), tokenize=False, add_generation_prompt=True
    )
    assert rendered.count("<tool_call>") == 1
    assert "Let me add.\n<tool_call>" in rendered
