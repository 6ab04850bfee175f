"""Context strategies: hook order, append-only FullDialog, TruncatedThinkingContext."""

from __future__ import annotations

import itertools

import pytest

from ludic.context import ContextStrategy, FullDialog, TruncatedThinkingContext
from ludic.types import Message, ToolResult


def play_turn(ctx: ContextStrategy, reply: str, next_obs: str) -> list[Message]:
    prompt = ctx.on_before_act()
    ctx.on_after_act({"role": "assistant", "content": reply})
    ctx.on_after_step(next_obs, {})
    return prompt


def test_hooks_build_the_dialog() -> None:
    ctx = FullDialog(system_prompt="default")
    ctx.reset()
    ctx.on_env_reset("obs0", {})
    prompt = ctx.on_before_act()
    ctx.on_after_act({"role": "assistant", "content": "call", "tool_calls": []})
    ctx.on_tool_results([ToolResult(tool_call_id="c", name="f", content="42")])
    ctx.on_after_step(None, {})  # no next observation: nothing appended
    assert prompt == [
        {"role": "system", "content": "default"},
        {"role": "user", "content": "obs0"},
    ]
    assert [m["role"] for m in ctx.messages] == ["system", "user", "assistant", "tool"]
    assert ctx.messages[-1] == {"role": "tool", "tool_call_id": "c", "name": "f", "content": "42"}
    # reset with an explicit prompt overrides the default; an empty one means none.
    ctx.reset("other")
    assert ctx.messages == [{"role": "system", "content": "other"}]
    ctx.reset("")
    assert ctx.messages == []


def test_messages_and_prompts_are_copies() -> None:
    ctx = FullDialog()
    ctx.reset()
    ctx.on_env_reset("o", {})
    ctx.on_before_act()[0]["content"] = "mutated"
    ctx.messages[0]["content"] = "mutated"
    assert ctx.messages == [{"role": "user", "content": "o"}]


def test_full_dialog_is_append_only() -> None:
    ctx = FullDialog(system_prompt="s")
    ctx.reset()
    ctx.on_env_reset("o0", {})
    prompts = [play_turn(ctx, f"<think>t{i}</think>a{i}", f"o{i + 1}") for i in range(4)]
    for i, (prev, cur) in enumerate(itertools.pairwise(prompts)):
        reply = {"role": "assistant", "content": f"<think>t{i}</think>a{i}"}
        assert cur[: len(prev) + 1] == [*prev, reply]


def test_truncated_thinking_strips_earlier_turns_in_the_prompt_only() -> None:
    ctx = TruncatedThinkingContext(system_prompt="s")
    ctx.reset()
    ctx.on_env_reset("o0", {})
    for i in range(3):
        play_turn(ctx, f"<think>secret {i}</think>a{i}", f"o{i + 1}")
    prompt = ctx.on_before_act()
    assistant = [m["content"] for m in prompt if m["role"] == "assistant"]
    assert assistant == ["<think>...</think>a0", "<think>...</think>a1", "<think>...</think>a2"]
    # Full history is kept.
    kept = [m["content"] for m in ctx.messages if m["role"] == "assistant"]
    assert kept == [f"<think>secret {i}</think>a{i}" for i in range(3)]
    assert [m["role"] for m in prompt] == [m["role"] for m in ctx.messages]


def test_truncated_thinking_keep_last_and_placeholder() -> None:
    ctx = TruncatedThinkingContext(keep_last=1, placeholder="")
    ctx.reset()
    ctx.on_env_reset("o0", {})
    for i in range(3):
        play_turn(ctx, f"<think>t{i}</think>a{i}<think>more</think>", f"o{i + 1}")
    assistant = [m["content"] for m in ctx.on_before_act() if m["role"] == "assistant"]
    assert assistant == ["a0", "a1", "<think>t2</think>a2<think>more</think>"]


def test_truncated_thinking_keeps_the_current_turns_tool_loop_intact() -> None:
    """Inside one turn (no new observation yet) the prompt stays append-only."""
    ctx = TruncatedThinkingContext()
    ctx.reset()
    ctx.on_env_reset("o0", {})
    play_turn(ctx, "<think>old</think>a0", "o1")
    first = ctx.on_before_act()
    call = {"role": "assistant", "content": "<think>need a tool</think><tool_call>{}</tool_call>"}
    ctx.on_after_act(call)
    ctx.on_tool_results([ToolResult(tool_call_id="c", name="f", content="1")])
    second = ctx.on_before_act()
    assert second[: len(first) + 1] == [*first, call]
    assert second[1]["content"] == "<think>...</think>a0"


def test_truncated_thinking_custom_tags_and_bad_keep_last() -> None:
    ctx = TruncatedThinkingContext(open_tag="<r>", close_tag="</r>", placeholder="[r]")
    ctx.reset()
    ctx.on_env_reset("o", {})
    play_turn(ctx, "<r>x</r>y <think>z</think>", "o2")
    assert ctx.on_before_act()[1]["content"] == "[r]y <think>z</think>"
    with pytest.raises(ValueError, match="keep_last"):
        TruncatedThinkingContext(keep_last=-1)
