"""EditableContext: a context strategy whose earlier messages the agent may delete or summarise.

The history (`messages`) stays complete and append-only: a message's index there is its stable
id. The prompt is a view over it: deleted ids are left out and a summary stands where the
messages it replaces stood. Non-assistant messages are shown with an id tag (`[#3] ...`) so the
model can name them; assistant messages are never tagged, so a prompt without edits still
extends the previous call's tokens. An edit breaks that prefix property on purpose and is
marked (`mark_rewrite`): the sample builder closes the sequence so far as a snapshot. Every
edit is logged as a `ContextEdit` for the agent to put in step info. It does not choose what
to delete and counts no tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ludic.context.base import ContextStrategy
from ludic.types import JSON, Message

EditKind = Literal["delete", "summarize"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ContextEdit:
    """One edit of the prompt view.

    `requested_ids` are the ids the model named; `removed_ids` what was removed after expanding
    them (tool calls with their results, observations with the reply to them). `summary_id` is
    the id of the summary message that replaced them (None for a delete). `view_before` is the
    prompt's message ids just before the edit: the snapshot the sample builder closes.
    """

    kind: EditKind
    requested_ids: tuple[int, ...]
    removed_ids: tuple[int, ...]
    summary_id: int | None
    view_before: tuple[int, ...]
    view_after: tuple[int, ...]

    def to_dict(self) -> JSON:
        return {
            "kind": self.kind,
            "requested_ids": list(self.requested_ids),
            "removed_ids": list(self.removed_ids),
            "summary_id": self.summary_id,
            "view_before": list(self.view_before),
            "view_after": list(self.view_after),
        }


class EditableContext(ContextStrategy):
    """Full dialog with deletions and summaries, addressed by stable message ids.

    - `id_format`: the tag put before the content of messages whose role is in `tag_roles`.
    - `with_replies`: deleting an observation (a user message) also deletes the agent's reply
      to it: the assistant and tool messages that follow it up to the next user message (a
      whole tool loop), so one id removes one exchange.
    - `summary_role` / `summary_format`: how a summary message reads (`{ids}`, `{summary}`).

    Always removed together: an assistant message with tool calls and its tool results. Never
    removable: system messages, and the assistant message whose tool call is making the edit.
    """

    def __init__(
        self,
        system_prompt: str | None = None,
        *,
        show_ids: bool = True,
        id_format: str = "[#{id}] ",
        tag_roles: Sequence[str] = ("user", "tool"),
        with_replies: bool = True,
        summary_role: str = "user",
        summary_format: str = "Summary of {ids}: {summary}",
    ) -> None:
        super().__init__(system_prompt)
        self.show_ids = show_ids
        self.id_format = id_format
        self.tag_roles = frozenset(tag_roles)
        self.with_replies = with_replies
        self.summary_role = summary_role
        self.summary_format = summary_format
        self._view: list[int] = []
        self._synced = 0
        self._edits: list[ContextEdit] = []
        self._pending: list[ContextEdit] = []

    # ---- views --------------------------------------------------------------------------
    @property
    def visible_ids(self) -> list[int]:
        """Ids of the messages the next prompt shows, in order."""
        self._sync()
        return list(self._view)

    @property
    def edits(self) -> list[ContextEdit]:
        """Every edit of this episode, in order."""
        return list(self._edits)

    def pop_pending_edits(self) -> list[ContextEdit]:
        """Edits made since the last call (the agent attaches them to the step that made them)."""
        pending, self._pending = self._pending, []
        return pending

    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        self._view, self._synced = [], 0
        self._edits, self._pending = [], []

    def on_before_act(self) -> list[Message]:
        self._sync()
        return [self._render(i) for i in self._view]

    # ---- edits ----------------------------------------------------------------------------
    def delete(self, message_ids: Iterable[int]) -> ContextEdit:
        """Remove messages from the prompt view (they stay in `messages`)."""
        return self._edit("delete", message_ids, summary=None)

    def summarize(self, message_ids: Iterable[int], summary: str) -> ContextEdit:
        """Replace messages in the prompt view by one summary message placed where the first
        of them stood. The summary is appended to the history and gets the next id."""
        if not isinstance(summary, str) or not summary.strip():
            raise ValueError("summary must be a non-empty string")
        return self._edit("summarize", message_ids, summary=summary)

    def _edit(self, kind: EditKind, message_ids: Iterable[int], summary: str | None) -> ContextEdit:
        self._sync()
        requested = _as_ids(message_ids)
        removed = self._expand(requested)
        before = tuple(self._view)
        summary_id: int | None = None
        positions = [before.index(i) for i in removed]
        view = [i for i in before if i not in set(removed)]
        if summary is not None:
            summary_id = len(self._messages)
            names = ", ".join(f"#{i}" for i in removed)
            content = self.summary_format.format(ids=names, summary=summary)
            self._messages.append({"role": self.summary_role, "content": content})
            self._synced = len(self._messages)
            view.insert(min(positions), summary_id)
        self._view = view
        edit = ContextEdit(
            kind=kind,
            requested_ids=requested,
            removed_ids=removed,
            summary_id=summary_id,
            view_before=before,
            view_after=tuple(view),
        )
        self._edits.append(edit)
        self._pending.append(edit)
        self.mark_rewrite()
        return edit

    def _expand(self, requested: tuple[int, ...]) -> tuple[int, ...]:
        """Validate the named ids and add what must go with them; sorted result."""
        problems = [p for i in requested if (p := self._problem(i)) is not None]
        if problems:
            raise ValueError("; ".join(problems))
        removed = set(requested)
        if self.with_replies:
            for i in requested:
                if self._messages[i].get("role") == "user":
                    removed.update(self._replies(i))
        for i in list(removed):
            removed |= self._tool_block(i)
        blocked = sorted(i for i in removed if self._problem(i) is not None)
        if blocked:
            raise ValueError(
                f"deleting {sorted(requested)} would also remove messages "
                f"{[f'#{i}' for i in blocked]} (a tool call and its results go together), "
                "and those cannot be removed"
            )
        return tuple(sorted(removed))

    def _problem(self, i: int) -> str | None:
        n = len(self._messages)
        if not 0 <= i < n:
            return f"message #{i} does not exist (ids are 0 to {n - 1})"
        if i not in self._view:
            return f"message #{i} is not in the context (already deleted or summarised)"
        if self._messages[i].get("role") == "system":
            return f"message #{i} is the system prompt and cannot be removed"
        if i == self._current_call():
            return f"message #{i} is the call making this edit and cannot be removed"
        return None

    def _replies(self, i: int) -> list[int]:
        """The visible assistant / tool messages after history message i, up to the next
        other message or the call making this edit."""
        replies = []
        for j in range(i + 1, len(self._messages)):
            if self._messages[j].get("role") not in ("assistant", "tool") or j == (
                self._current_call()
            ):
                break
            if j in self._view:
                replies.append(j)
        return replies

    def _current_call(self) -> int | None:
        """The last history message when it is an assistant message calling tools."""
        last = self._messages[-1] if self._messages else {}
        if last.get("role") == "assistant" and last.get("tool_calls"):
            return len(self._messages) - 1
        return None

    def _tool_block(self, i: int) -> set[int]:
        """An assistant tool-call message and its results, from any one of them."""
        call_ids = _call_ids(self._messages[i])
        if not call_ids:
            return set()
        return {j for j in self._view if _call_ids(self._messages[j]) & call_ids}

    # ---- rendering ------------------------------------------------------------------------
    def _sync(self) -> None:
        """Show messages appended to the history since the last look."""
        n = len(self._messages)
        if self._synced < n:
            self._view.extend(range(self._synced, n))
            self._synced = n

    def _render(self, i: int) -> Message:
        message = dict(self._messages[i])
        content = message.get("content")
        if self.show_ids and message.get("role") in self.tag_roles and isinstance(content, str):
            message["content"] = self.id_format.format(id=i) + content
        return message


def _call_ids(message: Message) -> set[str]:
    """Tool call ids an assistant message makes or a tool message answers."""
    if message.get("role") == "assistant":
        return {str(c.get("id")) for c in message.get("tool_calls") or ()}
    if message.get("role") == "tool":
        return {str(message.get("tool_call_id"))}
    return set()


def _as_ids(message_ids: Iterable[int]) -> tuple[int, ...]:
    if isinstance(message_ids, str | bytes):
        raise ValueError(f"message_ids must be a list of integers, got {message_ids!r}")
    ids = tuple(message_ids)
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise ValueError(f"message_ids must be integers, got {bad!r}")
    if not ids:
        raise ValueError("message_ids is empty: name at least one message id, e.g. [3]")
    return tuple(dict.fromkeys(ids))


__all__ = ["ContextEdit", "EditKind", "EditableContext"]
