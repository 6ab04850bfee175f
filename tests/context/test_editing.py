"""EditableContext: stable ids, deletions and summaries in the prompt view, complete history."""

from __future__ import annotations

import pytest

from ludic.context.editing import EditableContext
from ludic.types import ToolResult


def dialog(n_turns: int = 3, **kwargs: object) -> EditableContext:
    """sys(#0), then obs k / reply k pairs: obs0 #1, a0 #2, obs1 #3, a1 #4, obs2 #5, a2 #6."""
    ctx = EditableContext("sys", **kwargs)  # type: ignore[arg-type]
    ctx.reset()
    ctx.on_env_reset("obs0", {})
    for k in range(n_turns):
        ctx.on_before_act()
        ctx.on_after_act({"role": "assistant", "content": f"a{k}"})
        if k < n_turns - 1:
            ctx.on_after_step(f"obs{k + 1}", {})
    return ctx


def contents(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages]


def call_tools(ctx: EditableContext, call_id: str = "c1") -> None:
    """The model's current message calls a tool (the edit runs while it is the last message)."""
    ctx.on_after_act(
        {
            "role": "assistant",
            "content": "<tool_call>...</tool_call>",
            "tool_calls": [{"id": call_id, "type": "function", "function": {}}],
        }
    )


def test_ids_are_history_indices_and_only_non_assistant_messages_are_tagged() -> None:
    ctx = dialog()
    assert contents(ctx.on_before_act()) == [
        "sys",
        "[#1] obs0",
        "a0",
        "[#3] obs1",
        "a1",
        "[#5] obs2",
        "a2",
    ]
    assert ctx.visible_ids == list(range(7))


def test_without_edits_every_prompt_extends_the_previous_one() -> None:
    ctx = EditableContext("sys")
    ctx.reset()
    ctx.on_env_reset("obs0", {})
    previous: list[dict] = []
    for k in range(4):
        prompt = ctx.on_before_act()
        assert prompt[: len(previous)] == previous
        ctx.on_after_act({"role": "assistant", "content": f"a{k}"})
        previous = [*prompt, {"role": "assistant", "content": f"a{k}"}]
        ctx.on_after_step(f"obs{k + 1}", {})


def test_delete_removes_an_observation_with_its_reply_and_keeps_the_history() -> None:
    ctx = dialog()
    call_tools(ctx)
    edit = ctx.delete([3])
    assert edit.kind == "delete"
    assert (edit.requested_ids, edit.removed_ids, edit.summary_id) == ((3,), (3, 4), None)
    assert edit.view_before == (0, 1, 2, 3, 4, 5, 6, 7)
    assert edit.view_after == (0, 1, 2, 5, 6, 7)
    assert contents(ctx.on_before_act())[:5] == ["sys", "[#1] obs0", "a0", "[#5] obs2", "a2"]
    assert len(ctx.messages) == 8  # the full history is untouched
    # Ids stay stable after an edit: a new observation gets the next history index.
    ctx.on_tool_results([ToolResult(tool_call_id="c1", name="delete_context", content="ok")])
    ctx.on_after_step("obs3", {})
    assert contents(ctx.on_before_act())[-1] == "[#9] obs3"


def test_without_replies_only_the_named_messages_go() -> None:
    ctx = dialog(with_replies=False)
    ctx.delete([1, 4])
    assert ctx.visible_ids == [0, 2, 3, 5, 6]


def test_deletes_at_the_start_middle_and_end_and_several_in_a_row() -> None:
    ctx = dialog(4)  # obs #1 #3 #5 #7, replies #2 #4 #6 #8
    ctx.delete([5])
    assert ctx.visible_ids == [0, 1, 2, 3, 4, 7, 8]
    ctx.delete([1])
    assert ctx.visible_ids == [0, 3, 4, 7, 8]
    ctx.delete([7, 3])
    assert ctx.visible_ids == [0]
    assert [e.removed_ids for e in ctx.edits] == [(5, 6), (1, 2), (3, 4, 7, 8)]
    assert len(ctx.pop_pending_edits()) == 3 and ctx.pop_pending_edits() == []


def test_summary_replaces_messages_in_place_and_gets_the_next_id() -> None:
    ctx = dialog()
    call_tools(ctx)
    edit = ctx.summarize([1, 3], "the code is 4")
    assert edit.removed_ids == (1, 2, 3, 4)
    assert edit.summary_id == 8
    assert ctx.visible_ids == [0, 8, 5, 6, 7]
    prompt = ctx.on_before_act()
    assert prompt[1] == {"role": "user", "content": "[#8] Summary of #1, #2, #3, #4: the code is 4"}
    assert ctx.messages[8]["content"].endswith("the code is 4")


def test_a_tool_call_goes_with_its_results() -> None:
    ctx = dialog(1)  # sys #0, obs0 #1, a0 #2
    ctx.on_after_step("obs1", {})  # #3
    call_tools(ctx, "old")  # #4, an earlier tool loop ...
    ctx.on_tool_results([ToolResult(tool_call_id="old", name="lookup", content="r")])  # #5
    ctx.on_after_act({"role": "assistant", "content": "done"})  # #6
    ctx.delete([5])  # naming the result removes its call too
    assert ctx.visible_ids == [0, 1, 2, 3, 6]


def test_an_observation_answered_by_a_tool_call_takes_the_call_and_results() -> None:
    ctx = dialog(1)
    ctx.on_after_step("obs1", {})  # #3
    call_tools(ctx, "old")  # #4 replies to #3 with a tool call
    ctx.on_tool_results([ToolResult(tool_call_id="old", name="lookup", content="r")])  # #5
    ctx.on_after_act({"role": "assistant", "content": "done"})  # #6
    assert ctx.delete([3]).removed_ids == (3, 4, 5, 6)  # the whole tool loop that answered


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([0], "system prompt"),
        ([7], "the call making this edit"),
        ([42], "does not exist"),
        ([], "empty"),
        (["3"], "must be integers"),
        ([True], "must be integers"),
    ],
)
def test_bad_ids_are_refused_and_change_nothing(ids: list, message: str) -> None:
    ctx = dialog()
    call_tools(ctx)  # #7 is the current call
    with pytest.raises(ValueError, match=message):
        ctx.delete(ids)
    assert ctx.visible_ids == list(range(8))
    assert ctx.edits == [] and ctx.pop_pending_edits() == []


def test_an_already_deleted_message_cannot_be_deleted_again() -> None:
    ctx = dialog()
    ctx.delete([3])
    with pytest.raises(ValueError, match="not in the context"):
        ctx.delete([4])
    with pytest.raises(ValueError, match="non-empty"):
        ctx.summarize([1], "  ")


def test_the_reply_of_an_observation_is_kept_when_it_is_the_current_call() -> None:
    ctx = dialog(1)
    ctx.on_after_step("obs1", {})  # #3
    call_tools(ctx)  # #4 answers #3 and is making the edit
    assert ctx.delete([3]).removed_ids == (3,)


def test_duplicates_are_ignored_and_reset_clears_edits() -> None:
    ctx = dialog()
    assert ctx.delete([1, 1]).requested_ids == (1,)
    ctx.reset()
    assert ctx.edits == [] and ctx.visible_ids == [0]
