"""ContextEditingAgent: a ToolAgent that deletes or summarises earlier messages of its own
context through internal tools (seed 002's `deleteContext`), recording each edit as a snapshot.

It does not decide when the context is too long (the model does, prompted by its budget) and
does not build samples: the sample builder turns the rewritten prompt into a snapshot segment.

How seed 002 maps onto Ludic. An edit runs inside the agent's tool loop: the model call that
asks for it is recorded (its tokens end the sequence so far), the context drops the named
messages and marks the rewrite (its `history_version`, stamped on every step as
`info["context_version"]`), and the next call's prompt no longer extends that sequence.
`build_samples` then closes the sequence as a snapshot sample (`meta["is_snapshot"]`, `segment_index`) and starts
the next one from the new prompt; the final segment is the trajectory that carries the outcome.
The step that made the edit gets `info["context_edits"]` (what was removed),
`info["snapshot_index"]` (0, 1, ... per episode) and `info["snapshot_reward"]`, the snapshot's
own precomputed reward (`snapshot_reward(step)`, e.g. a context-length penalty), which
`snapshot_policy="own_reward"` uses; "share" copies the outcome to snapshots instead, "split"
divides it. An episode without edits is one ordinary trajectory per turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ludic.agents.tool_agent import ToolAgent, ToolLike
from ludic.agents.tools import tool_from_callable
from ludic.context.base import ContextStrategy
from ludic.context.editing import EditableContext
from ludic.inference.client import ChatClient
from ludic.types import AgentStep

# Must equal ludic.rollouts.SNAPSHOT_REWARD_KEY (agents do not import rollouts).
SNAPSHOT_REWARD_KEY = "snapshot_reward"
CONTEXT_EDITS_KEY = "context_edits"
SNAPSHOT_INDEX_KEY = "snapshot_index"

SnapshotReward = Callable[[AgentStep], float]

# The call form is the one the Hermes/Qwen chat templates render (see ludic.agents.react).
EDIT_INSTRUCTIONS = (
    "Messages in your context carry ids like [#3]. Your context is small: remove messages "
    "you no longer need with {delete}(message_ids) (removing an observation also removes "
    "your reply to it){summarize}.\nTo call a tool, write the call on its own lines, exactly "
    "in this form, and stop:\n"
    '<tool_call>\n{{"name": "{delete}", "arguments": {{"message_ids": [3]}}}}\n</tool_call>'
)


def snapshot_tokens(step: AgentStep) -> int:
    """Length in tokens of the sequence a step closes: its prompt plus its completion."""
    if step.trace is not None:
        return len(step.trace.prompt_token_ids) + len(step.trace.completion_token_ids)
    return int(step.info.get("prompt_tokens", 0)) + int(step.info.get("completion_tokens", 0))


def no_snapshot_reward(step: AgentStep) -> float:
    """The default snapshot reward: 0.0 for every snapshot."""
    return 0.0


class ContextEditingAgent(ToolAgent):
    """A ToolAgent with two extra internal tools over an `EditableContext`:

    - `delete_context(message_ids)`: remove messages from the context;
    - `summarize_context(message_ids, summary)`: replace them by one summary message
      (left out with `summarize_tool=False`).

    Tool names are configurable (`delete_tool_name="deleteContext"` for seed 002's name). Bad
    ids (unknown, already gone, the system prompt, the call itself) come back to the model as
    a tool error and change nothing. `snapshot_reward` scores each edit step (default 0.0).
    `instructions` is appended to the system prompt (None: leave it as is).
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        context: ContextStrategy | None = None,
        tools: Sequence[ToolLike] = (),
        snapshot_reward: SnapshotReward = no_snapshot_reward,
        summarize_tool: bool = True,
        delete_tool_name: str = "delete_context",
        summarize_tool_name: str = "summarize_context",
        instructions: str | None = EDIT_INSTRUCTIONS,
        **kwargs: Any,
    ) -> None:
        editable = context if context is not None else EditableContext()
        if not isinstance(editable, EditableContext):
            raise TypeError(
                f"ContextEditingAgent needs an EditableContext, got {type(editable).__name__}; "
                "pass context=EditableContext(...) or leave it out"
            )
        own = [tool_from_callable(self.delete_context, name=delete_tool_name)]
        if summarize_tool:
            own.append(tool_from_callable(self.summarize_context, name=summarize_tool_name))
        super().__init__(client, context=editable, tools=[*tools, *own], **kwargs)
        if len(self.tools) != len(tools) + len(own):
            raise ValueError(
                f"a tool passed in `tools` has the name of a context tool "
                f"({[t.name for t in own]}); rename it or change delete_tool_name / "
                "summarize_tool_name"
            )
        self.editable = editable
        self.snapshot_reward = snapshot_reward
        self.instructions = instructions
        self._tool_names = (delete_tool_name, summarize_tool_name if summarize_tool else None)
        self._snapshots = 0

    # ---- the tools (bound methods, exposed to the model) --------------------------------
    def delete_context(self, message_ids: list[int]) -> str:
        """Remove earlier messages from your context to free space.

        Args:
            message_ids: ids of the messages to remove, as shown in their [#id] tags
        """
        edit = self.editable.delete(message_ids)
        return f"Removed {_names(edit.removed_ids)}. {len(edit.view_after)} messages remain."

    def summarize_context(self, message_ids: list[int], summary: str) -> str:
        """Replace earlier messages by a short summary you write.

        Args:
            message_ids: ids of the messages to replace, as shown in their [#id] tags
            summary: what to keep from them
        """
        edit = self.editable.summarize(message_ids, summary)
        return (
            f"Replaced {_names(edit.removed_ids)} by summary #{edit.summary_id}. "
            f"{len(edit.view_after)} messages remain."
        )

    # ---- agent hooks ------------------------------------------------------------------------
    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        self._snapshots = 0

    def episode_system_prompt(self, env_prompt: str | None) -> str | None:
        base = super().episode_system_prompt(env_prompt)
        if self.instructions is None:
            return base
        delete, summarize = self._tool_names
        extra = f", or replace them by a summary with {summarize}(message_ids, summary)"
        text = self.instructions.format(delete=delete, summarize=extra if summarize else "")
        return f"{base}\n\n{text}" if base else text

    def _make_step(self, **kwargs: Any) -> AgentStep:
        """Every step is built right after its own tool calls ran, so the edits pending now
        are the ones this step's model call asked for."""
        step = super()._make_step(**kwargs)
        edits = self.editable.pop_pending_edits()
        if not edits:
            return step
        info = {
            **step.info,
            CONTEXT_EDITS_KEY: [e.to_dict() for e in edits],
            SNAPSHOT_INDEX_KEY: self._snapshots,
        }
        self._snapshots += 1
        step = dataclasses.replace(step, info=info)
        reward = float(self.snapshot_reward(step))
        return dataclasses.replace(step, info={**info, SNAPSHOT_REWARD_KEY: reward})


def _names(ids: Sequence[int]) -> str:
    return ", ".join(f"#{i}" for i in ids)


__all__ = [
    "CONTEXT_EDITS_KEY",
    "EDIT_INSTRUCTIONS",
    "SNAPSHOT_INDEX_KEY",
    "SNAPSHOT_REWARD_KEY",
    "ContextEditingAgent",
    "SnapshotReward",
    "no_snapshot_reward",
    "snapshot_tokens",
]
