"""The tool-call form the agents' own instructions teach is the one the tiny model's chat
template renders back: a call written that way leaves the next prompt append-only (one
training sequence per tool loop), while the compact one-line form does not (template drift)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from ludic.agents import ReActAgent, ToolAgent
from ludic.agents.context_editing import ContextEditingAgent
from ludic.agents.react import REACT_INSTRUCTIONS
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.embedded.prompts import render_prompt_ids
from ludic.models import train_tiny_tokenizer
from ludic.parsers import xml_tag_parser

TOKENIZER = train_tiny_tokenizer()
IM_END = TOKENIZER.convert_tokens_to_ids("<|im_end|>")
FORM = re.compile(r"<tool_call>(\s*)\{.*\}(\s*)</tool_call>")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    return a + b


class TemplateClient:
    """Scripted replies with the ids the embedded engine would use: the prompt rendered by the
    tiny tokenizer's chat template (with the request's tools), the reply encoded and ended by
    <|im_end|>."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        text = self.replies.pop(0)
        prompt = render_prompt_ids(TOKENIZER, request.messages, request.tools)
        completion = [*TOKENIZER.encode(text, add_special_tokens=False), IM_END]
        return ChatResponse(
            text=text,
            prompt_token_ids=tuple(prompt),
            completion_token_ids=tuple(completion),
            finish_reason="stop",
        )


def written_as_taught(instructions: str, name: str, arguments: dict[str, object]) -> str:
    """A reply that follows `instructions`' call form to the letter, with a real call."""
    match = FORM.search(instructions)
    assert match, "the instructions show no <tool_call> example"
    before, after = match.groups()
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<think>I will use {name}.</think>\n<tool_call>{before}{body}{after}</tool_call>"


def compact(name: str, arguments: dict[str, object]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


async def tool_loop_extends(agent_of: Callable[[list[str]], ToolAgent], call: str) -> bool:
    """Run one act (the call, then a final answer): does the second prompt extend the first
    call's prompt + completion ids?"""
    agent = agent_of([call, "<move>5</move>"])
    agent.reset("Answer with <move>N</move>.")
    agent.on_env_reset("What is 2 + 3?", {})
    act = await agent.act(turn_id="t0")
    first, second = (s.trace for s in act.steps)
    assert first is not None and second is not None
    assert act.steps[0].tool_results and not act.steps[0].tool_results[0].is_error
    sequence = first.prompt_token_ids + first.completion_token_ids
    return second.prompt_token_ids[: len(sequence)] == sequence


def react(replies: list[str]) -> ToolAgent:
    return ReActAgent(TemplateClient(replies), tools=[add], parser=xml_tag_parser("move"))


def editing(replies: list[str]) -> ToolAgent:
    return ContextEditingAgent(TemplateClient(replies), parser=xml_tag_parser("move"))


async def test_react_instructions_teach_a_form_the_template_renders_back() -> None:
    instructions = REACT_INSTRUCTIONS.format(tools="")
    args = {"a": 2, "b": 3}
    assert await tool_loop_extends(react, written_as_taught(instructions, "add", args))
    assert not await tool_loop_extends(react, compact("add", args))  # the old form drifts


@pytest.mark.parametrize("summarize", [True, False])
async def test_context_editing_instructions_teach_a_form_the_template_renders_back(
    summarize: bool,
) -> None:
    def agent_of(replies: list[str]) -> ToolAgent:
        return ContextEditingAgent(
            TemplateClient(replies),
            tools=[add],
            summarize_tool=summarize,
            parser=xml_tag_parser("move"),
        )

    agent = agent_of([])
    agent.reset(None)
    system = agent.context.messages[0]["content"]
    assert '{"name": "delete_context", "arguments": {"message_ids": [3]}}' in system
    # A delete rewrites the next prompt on purpose, so the form is checked on a tool that
    # edits nothing, written as the same instructions teach.
    reply = written_as_taught(system, "add", {"a": 2, "b": 3})
    assert await tool_loop_extends(agent_of, reply)
    assert not await tool_loop_extends(agent_of, compact("add", {"a": 2, "b": 3}))


def test_the_taught_form_is_what_the_template_renders() -> None:
    # Rendering an assistant message with one tool call shows exactly the taught block.
    call = {"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    text = TOKENIZER.apply_chat_template(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ],
        tokenize=False,
    )
    block = written_as_taught(REACT_INSTRUCTIONS.format(tools=""), "add", {"a": 1})
    assert block.split("\n", 1)[1] in text
