"""The ChatClient contract: what every inference backend returns (token-in / token-out).

A backend returns the prompt ids it actually used, the sampled ids, their behaviour logprobs,
the finish reason and the policy version, so training never re-tokenizes. This module holds the
contract only; backends live beside it and import torch or HTTP libraries lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from ludic.inference.sampling import SamplingConfig
from ludic.types import BehaviorSampling, Message, TokenTrace, ToolCall


@dataclass(frozen=True, kw_only=True, slots=True)
class ChatResponse:
    """One completion with its exact tokens.

    `tool_calls` is filled by backends that parse tool calls server-side (vLLM with a tool
    parser); otherwise agents parse them from `text`. `completion_logprobs` follow the one
    definition of behaviour logprobs (`ludic.types.BehaviorSampling`); `sampling` is the
    transform they were computed under, stamped by the caller that knows the request
    (`with_sampling`) unless the backend set it. `extra["forced_token_positions"]` lists
    completion tokens the backend forced (max_think). `policy_version` is the version the
    first token was sampled under; `extra["policy_version_end"]`, present only where it
    differs, the last token's (a weight push landed mid-reply: the tokens mix two policies).
    """

    text: str
    prompt_token_ids: tuple[int, ...] = ()
    completion_token_ids: tuple[int, ...] = ()
    completion_logprobs: tuple[float, ...] | None = None
    finish_reason: str | None = None
    policy_version: int | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    sampling: BehaviorSampling | None = None

    def with_sampling(self, sampling: SamplingConfig) -> ChatResponse:
        """This response stamped with the request's sampling transform (kept if already set)."""
        if self.sampling is not None:
            return self
        stamp = BehaviorSampling(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
        )
        return replace(self, sampling=stamp)

    def trace(self) -> TokenTrace | None:
        """The token trace, or None when the backend returned no token ids."""
        if not self.prompt_token_ids and not self.completion_token_ids:
            return None
        return TokenTrace(
            prompt_token_ids=self.prompt_token_ids,
            completion_token_ids=self.completion_token_ids,
            completion_logprobs=self.completion_logprobs,
            sampling=self.sampling,
            forced_positions=tuple(self.extra.get("forced_token_positions", ())),
        )

    def to_info(self) -> dict[str, Any]:
        """Facts merged into step info (never the token ids, which live in the trace):
        `policy_version_end` too where a push landed mid-reply, so a step's logs show that its
        completion mixed two policies."""
        info: dict[str, Any] = {
            "finish_reason": self.finish_reason,
            "completion_tokens": len(self.completion_token_ids),
            "prompt_tokens": len(self.prompt_token_ids),
        }
        if self.policy_version is not None:
            info["policy_version"] = self.policy_version
        # policy_version_end: only where it differs; served_by, failed_over_from: a ServerPool
        for key in ("policy_version_end", "served_by", "failed_over_from"):
            if key in self.extra:
                info[key] = self.extra[key]
        return info


@dataclass(frozen=True, kw_only=True, slots=True)
class ChatRequest:
    """One model call. `prompt_token_ids` set means token-in mode: the backend uses these ids
    as the prompt and ignores the chat template (messages are kept for logging)."""

    messages: Sequence[Message]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    tools: Sequence[dict[str, Any]] | None = None
    prompt_token_ids: Sequence[int] | None = None


@runtime_checkable
class ChatClient(Protocol):
    """Anything that turns a ChatRequest into a ChatResponse."""

    async def complete(self, request: ChatRequest) -> ChatResponse: ...
