"""TruncatedThinkingContext: hide earlier turns' `<think>` blocks from the prompt, keep them in
history.

The prompt is no longer append-only across turns (an earlier assistant message changes once
a later turn starts); each call that hides a block marks a rewrite, which the sample builder
handles by closing the sequence as a snapshot.
Within a turn (a tool loop) the prompt stays append-only. It does not summarise the thinking it
removes.
"""

from __future__ import annotations

from ludic.context.base import ContextStrategy
from ludic.parsers import tag_blocks
from ludic.types import Message


class TruncatedThinkingContext(ContextStrategy):
    """Replace `<think>...</think>` in earlier turns' assistant messages by `placeholder`.

    A turn starts at a user message (an observation); assistant messages after the last one
    (the current turn's tool loop) keep their thinking, as reasoning models expect. Of the
    earlier turns' assistant messages, the last `keep_last` keep theirs too (0: strip all).
    `.messages` always holds the full, unstripped history.
    """

    def __init__(
        self,
        system_prompt: str | None = None,
        *,
        placeholder: str = "<think>...</think>",
        keep_last: int = 0,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
    ) -> None:
        super().__init__(system_prompt)
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0, got {keep_last}")
        if not open_tag or not close_tag:
            raise ValueError("open_tag and close_tag must be non-empty, e.g. '<think>'")
        self.placeholder = placeholder
        self.keep_last = keep_last
        self.open_tag, self.close_tag = open_tag, close_tag
        self._stripped: set[int] = set()  # history indices whose thinking the prompt hides

    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        self._stripped = set()

    def on_before_act(self) -> list[Message]:
        messages = self.messages
        turn_start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
        earlier = [i for i, m in enumerate(messages[:turn_start]) if m.get("role") == "assistant"]
        newly_hidden = False
        for i in earlier[: max(len(earlier) - self.keep_last, 0)]:
            content = messages[i].get("content")
            if isinstance(content, str):
                stripped = self._without_thinking(content)
                if stripped != content and i not in self._stripped:
                    self._stripped.add(i)
                    newly_hidden = True
                messages[i]["content"] = stripped
        if newly_hidden:  # a message the model saw (or wrote) whole is now shown stripped
            self.mark_rewrite()
        return messages

    def _without_thinking(self, content: str) -> str:
        """`content` with each think block replaced by the placeholder (linear: `tag_blocks`)."""
        pieces: list[str] = []
        pos = 0
        for start, _, _, end in tag_blocks(content, self.open_tag, self.close_tag):
            pieces += [content[pos:start], self.placeholder]
            pos = end
        return "".join(pieces) + content[pos:]
