"""Every strategy marks a rewrite exactly when its next prompt stops extending the previous
prompt plus the model's reply: the marker the sample builder cuts snapshots at."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import pytest

from ludic.context import ContextStrategy, FullDialog, TruncatedThinkingContext
from ludic.context.editing import EditableContext
from ludic.context.latest_observation import LatestObservationContext
from ludic.types import Message

# An episode as hook calls: ("act", reply) builds a prompt and stores the reply;
# ("obs", text) / ("feedback", text) end a turn; ("delete", ids) edits an EditableContext.
EPISODE: list[tuple[str, object]] = [
    ("act", "<think>a</think>x"),
    ("obs", "o1"),
    ("act", "plain"),
    ("feedback", "bad"),
    ("act", "<think>b</think>y"),
    ("feedback", "bad again"),
    ("act", "z"),
    ("obs", "o2"),
    ("delete", [1]),
    ("act", "<think>c</think>w"),
]


def run(ctx: ContextStrategy) -> list[tuple[list[Message], Message, int]]:
    """(prompt, reply, history version of the prompt) for every act of EPISODE."""
    ctx.reset("sys")
    ctx.on_env_reset("o0", {})
    calls = []
    for kind, value in EPISODE:
        if kind == "act":
            prompt = ctx.on_before_act()
            reply: Message = {"role": "assistant", "content": str(value)}
            calls.append((prompt, reply, ctx.history_version))
            ctx.on_after_act(reply)
        elif kind == "obs":
            ctx.on_after_step(str(value), {})
        elif kind == "feedback":
            ctx.on_after_step(str(value), {"parse_error": True})
        elif isinstance(ctx, EditableContext):
            ctx.delete(value)  # type: ignore[arg-type]
    return calls


STRATEGIES: dict[str, Callable[[], ContextStrategy]] = {
    "full": FullDialog,
    "truncated_thinking": TruncatedThinkingContext,
    "latest_observation": LatestObservationContext,
    "editable": lambda: EditableContext(show_ids=False),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_version_changes_exactly_where_the_prompt_stops_extending(name: str) -> None:
    calls = run(STRATEGIES[name]())
    changed, broke = [], []
    for (old, reply, v_old), (new, _, v_new) in pairwise(calls):
        changed.append(v_new != v_old)
        broke.append(new[: len(old) + 1] != [*old, reply])
    assert changed == broke
    expected_rewrites = {
        "full": 0,
        "truncated_thinking": 2,  # "a" hidden when turn 1 starts, "b" when turn 2 starts
        "latest_observation": 3,  # o1 replaces o0, the second failure drops the first, o2
        "editable": 1,  # the delete
    }[name]
    assert sum(changed) == expected_rewrites


def test_reset_restarts_the_version() -> None:
    ctx = EditableContext()
    run(ctx)
    assert ctx.history_version == 1
    ctx.reset()
    assert ctx.history_version == 0


def test_truncated_thinking_marks_once_per_hidden_message() -> None:
    ctx = TruncatedThinkingContext()
    ctx.reset()
    ctx.on_env_reset("o0", {})
    ctx.on_before_act()
    ctx.on_after_act({"role": "assistant", "content": "<think>t</think>a"})
    ctx.on_after_step("o1", {})
    ctx.on_before_act()
    ctx.on_before_act()  # building the same prompt again is no new rewrite
    assert ctx.history_version == 1
    ctx.on_after_act({"role": "assistant", "content": "no thinking"})
    ctx.on_after_step("o2", {})
    ctx.on_before_act()  # nothing to hide in "no thinking": still append-only
    assert ctx.history_version == 1
