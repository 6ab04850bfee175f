"""Chat messages and what surrounds them: the OpenAI message alias, tool calls, tool results and
parse results, plus `new_id`. Token-level traces live in `ludic.types.tokens`; steps and
rollouts in `ludic.types.steps` / `ludic.types.rollout`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

# A chat message in the OpenAI format: {"role": ..., "content": ..., optional "tool_calls",
# "tool_call_id", "name"}. Kept as a plain dict so it goes to any OpenAI-compatible server as is.
Message: TypeAlias = dict[str, Any]
JSON: TypeAlias = dict[str, Any]
Info: TypeAlias = dict[str, Any]


def new_id() -> str:
    """A fresh random id (hex uuid4)."""
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """A tool call the model made. `arguments` is the raw JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> JSON:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolCall:
        return cls(id=d["id"], name=d["name"], arguments=d["arguments"])

    def to_message_part(self) -> JSON:
        """OpenAI `tool_calls` entry for an assistant message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """The result fed back to the model for one tool call; `is_error` marks failures."""

    tool_call_id: str
    name: str
    content: str
    is_error: bool = False

    def to_dict(self) -> JSON:
        return {
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "content": self.content,
            "is_error": self.is_error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolResult:
        return cls(
            tool_call_id=d["tool_call_id"],
            name=d["name"],
            content=d["content"],
            is_error=bool(d.get("is_error", False)),
        )

    def to_message(self) -> Message:
        return {
            "role": "tool",
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "content": self.content,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ParseResult:
    """What a parser made of a completion.

    `action` is the env action, or None on a parse failure. `reward` is the parser's intrinsic
    reward (format bonus or failure penalty). `obs` is feedback for the agent on failure.
    """

    action: str | None
    reward: float = 0.0
    obs: str | None = None

    @property
    def ok(self) -> bool:
        return self.action is not None

    def to_dict(self) -> JSON:
        return {"action": self.action, "reward": self.reward, "obs": self.obs}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParseResult:
        return cls(action=d.get("action"), reward=float(d.get("reward", 0.0)), obs=d.get("obs"))
