"""One in-flight generation: its tokens, sampling knobs and stop rules (eos, stop ids/strings,
max_tokens, max_think).

Pure bookkeeping on Python lists; the batched forward passes live in `ludic.inference.embedded.batching`.
Stop strings follow vLLM: the text is cut before the stop string, the ids keep the token that
completed it. `on_token` (for streaming) is told after every recorded token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ludic.inference.client import ChatResponse

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_THINK_LOOKBACK_TOKENS = 64
_GARBLED_CHARS = 4  # at most 3 replacement characters for a split character, or 1 lost space


class TextCodec:
    """The tokenizer calls the engine needs, with the `</think>` ids computed once."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.think_close_ids: tuple[int, ...] = tuple(self.encode(THINK_CLOSE))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def first_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """Where the earliest stop string in `text[start:]` begins, and which one (None if none)."""
    hits = [(index, stop) for stop in stops if (index := text.find(stop, start)) >= 0]
    return min(hits) if hits else None


@dataclass(kw_only=True, slots=True, eq=False)
class SequenceState:
    """Mutable state of one request inside the engine. `on_token` is called after each recorded
    token and `on_done` once, on finish, both from the engine's worker thread."""

    prompt_ids: list[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    generator: torch.Generator
    eos_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    max_think: int | None = None
    on_done: Callable[[SequenceState], None] | None = None
    on_token: Callable[[SequenceState], None] | None = None
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced_queue: list[int] = field(default_factory=list)
    forced_positions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str | None = None
    policy_version: int | None = None
    policy_version_end: int | None = None
    cancelled: bool = False
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.cancelled or self.error is not None

    @property
    def context_ids(self) -> list[int]:
        """The ids to prefill: the prompt, and the completion so far when a request is admitted
        again mid-generation (after a failed batch step)."""
        return self.prompt_ids + self.completion_ids if self.completion_ids else self.prompt_ids

    def next_forced(self) -> int | None:
        """The token the engine must emit next instead of sampling (max_think), if any. It
        stays queued until `append` records it, so a step that fails first loses nothing."""
        return self.forced_queue[0] if self.forced_queue else None

    def append(self, token_id: int, logprob: float, *, forced: bool, codec: TextCodec) -> None:
        """Record one generated token and decide whether the sequence is finished."""
        if forced:
            self.forced_queue.pop(0)
            self.forced_positions.append(len(self.completion_ids))
        self.completion_ids.append(token_id)
        self.logprobs.append(logprob)
        if token_id in self.stop_token_ids:
            self._finish("stop", codec, stop_reason=token_id)
        elif token_id in self.eos_ids:
            self._finish("stop", codec)
        elif self.stop and self._check_stop_strings(codec):
            pass  # finished, the text cut before the stop string
        elif len(self.completion_ids) >= self.max_tokens:
            self._finish("length", codec)
        elif len(self.completion_ids) == self.max_think and self._thinking_open(codec):
            self.forced_queue = list(codec.think_close_ids)
        if self.on_token is not None:
            self.on_token(self)

    def _check_stop_strings(self, codec: TextCodec) -> bool:
        """Finish if the text now holds a stop string (cut before the first one). Earlier tokens
        were checked as they came, so a new stop string ends in the newest token's text: only
        the tail is decoded every step, the whole completion once, when the tail shows one."""
        if not any(stop in self._tail_text(codec) for stop in self.stop):
            return False
        text = codec.decode(self.completion_ids)
        hit = first_stop(text, self.stop)
        if hit is None:
            return False
        index, stop = hit
        self._finish("stop", codec, stop_reason=stop, text=text[:index])
        return True

    def _tail_text(self, codec: TextCodec) -> str:
        """The decoded end of the completion, long enough to hold any stop string ending in the
        newest token's text. Decoding from a token boundary can garble the first characters (a
        character whose bytes the boundary splits, a dropped leading space): a few spare ones
        cover that. Windows double until the text is long enough (special tokens decode to
        nothing, several byte tokens to one character)."""
        ids = self.completion_ids
        need = max(map(len, self.stop)) + len(codec.decode(ids[-1:])) + _GARBLED_CHARS
        window = need
        while True:
            text = codec.decode(ids[-window:])
            if len(text) >= need or window >= len(ids):
                return text
            window *= 2

    def _thinking_open(self, codec: TextCodec) -> bool:
        tail = self.prompt_ids[-_THINK_LOOKBACK_TOKENS:] + self.completion_ids
        text = codec.decode(tail, skip_special_tokens=False)
        return text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE)

    def _finish(
        self,
        reason: str,
        codec: TextCodec,
        *,
        stop_reason: str | int | None = None,
        text: str | None = None,
    ) -> None:
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.text = codec.decode(self.completion_ids) if text is None else text

    def to_response(self) -> ChatResponse:
        extra: dict[str, Any] = {}
        if self.stop_reason is not None:
            extra["stop_reason"] = self.stop_reason
        if self.forced_positions:
            extra["forced_token_positions"] = list(self.forced_positions)
        if self.policy_version_end not in (None, self.policy_version):
            extra["policy_version_end"] = self.policy_version_end
        return ChatResponse(
            text=self.text or "",
            prompt_token_ids=tuple(self.prompt_ids),
            completion_token_ids=tuple(self.completion_ids),
            completion_logprobs=tuple(self.logprobs),
            finish_reason=self.finish_reason,
            policy_version=self.policy_version,
            extra=extra,
        )
