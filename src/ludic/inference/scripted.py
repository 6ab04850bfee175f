"""A deterministic ChatClient for tests and demos: scripted replies with real token traces.

Tokens are UTF-8 bytes plus two special ids for ChatML markers, rendered append-only, so
samples stitched from its traces behave exactly like those from a real backend. It does not
model a policy: replies come from a list or a function of the messages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.unicode_check import check_text
from ludic.types import Message

IM_START = 256
IM_END = 257
VOCAB_SIZE = 258

Reply = str | tuple[str, str]  # text, or (text, finish_reason)
ReplyFn = Callable[[Sequence[Message]], Reply]


def encode_text(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _reply_ids(text: str) -> list[int]:
    """A reply's byte ids. A lone surrogate (an OpenAI-compatible server's JSON reply can hold
    one, as a `\\ud800` escape) is written as its three "surrogatepass" bytes: the ids decode
    to replacement characters, not to the text, as a real server's ids would."""
    return list(text.encode("utf-8", "surrogatepass"))


def render_chatml_ids(messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
    """ChatML as byte ids: <im_start>role\\ncontent<im_end>\\n per message; an assistant
    message's `tool_calls` follow its content as Hermes blocks (as the tiny model's template
    renders them)."""
    ids: list[int] = []
    for m in messages:
        ids.append(IM_START)
        ids += encode_text(f"{m['role']}\n{m.get('content') or ''}")
        for i, part in enumerate(m.get("tool_calls") or ()):
            separator = "\n" if i or m.get("content") else ""
            ids += encode_text(separator + hermes_tool_call(part))
        ids.append(IM_END)
        ids += encode_text("\n")
    if add_generation_prompt:
        ids.append(IM_START)
        ids += encode_text("assistant\n")
    return ids


def hermes_tool_call(part: Message) -> str:
    """An OpenAI `tool_calls` entry as a Hermes/Qwen text block (what such a model writes)."""
    call = part.get("function", part)
    arguments = call["arguments"]
    arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {arguments}}}\n</tool_call>'


def decode_ids(ids: Iterable[int]) -> str:
    out = bytearray()
    for t in ids:
        if t < 256:
            out.append(t)
    return out.decode("utf-8", errors="replace")


class ScriptedClient:
    """Replies from a fixed list (cycled) or a function of the messages.

    A reply may be `(text, "length")` to simulate a completion cut off by max_tokens.
    Logprobs are a deterministic function of the tokens so tests can check alignment.
    `policy_version` is reported on every response and may be bumped by tests. Lone surrogates
    are treated as `OpenAICompatibleClient` treats them: a reply holding one is returned (a
    server's JSON reply can; the parser records it as a parse failure), and a request whose
    messages hold one is refused with a ValueError naming where, as both real clients refuse it.
    """

    def __init__(
        self,
        replies: Sequence[Reply] | ReplyFn,
        *,
        policy_version: int = 0,
        return_logprobs: bool = True,
    ) -> None:
        self._replies = replies
        self._calls = 0
        self.policy_version = policy_version
        self.return_logprobs = return_logprobs
        self.requests: list[ChatRequest] = []

    @property
    def calls(self) -> int:
        return self._calls

    def _next_reply(self, messages: Sequence[Message]) -> tuple[str, str]:
        if callable(self._replies):
            reply = self._replies(messages)
        else:
            if not self._replies:
                raise ValueError("ScriptedClient needs at least one reply")
            reply = self._replies[self._calls % len(self._replies)]
        if isinstance(reply, tuple):
            return reply
        return reply, "stop"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        text, finish_reason = self._next_reply(request.messages)
        self._calls += 1
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            check_text(list(request.messages), "messages")
            prompt_ids = render_chatml_ids(request.messages)
        completion_ids = _reply_ids(text)
        if finish_reason != "length":
            completion_ids.append(IM_END)
        logprobs = None
        if self.return_logprobs:
            logprobs = tuple(_fake_logprob(prompt_ids, i, t) for i, t in enumerate(completion_ids))
        return ChatResponse(
            text=text,
            prompt_token_ids=tuple(prompt_ids),
            completion_token_ids=tuple(completion_ids),
            completion_logprobs=logprobs,
            finish_reason=finish_reason,
            policy_version=self.policy_version,
        )


def _fake_logprob(prompt_ids: Sequence[int], position: int, token: int) -> float:
    h = hashlib.blake2b(f"{len(prompt_ids)}:{position}:{token}".encode(), digest_size=4)
    return -(int.from_bytes(h.digest(), "little") % 1000) / 1000.0 - 0.001
