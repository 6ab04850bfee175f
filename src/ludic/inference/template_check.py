"""Chat-template conformance: is a template append-only over a multi-turn conversation?

Append-only means each assistant turn's prompt ids start with the previous turn's prompt ids
plus that turn's completion ids (as the template renders it, up to the end-of-turn token), so
a whole episode can be trained as one token sequence. Templates that rewrite history (Qwen3
dropping earlier `<think>` blocks, date stamps, ...) break it; the report says where. It checks
token ids only and does not judge whether a template is otherwise correct.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ludic.types import Message

_CONTEXT_TOKENS = 12


@dataclass(frozen=True, kw_only=True, slots=True)
class TemplateBreak:
    """Where the rendering stopped extending the previous turn.

    `message_index` is the assistant message whose prompt broke; `position` the first token
    index that differs; `expected` / `actual` decode a few tokens from there.
    """

    message_index: int
    position: int
    expected: str
    actual: str

    def describe(self) -> str:
        return (
            f"prompt of message {self.message_index} diverges at token {self.position}: "
            f"expected {self.expected!r}, got {self.actual!r}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class TemplateReport:
    """`turns_checked` counts assistant turns whose prompt was compared to the one before."""

    append_only: bool
    turns_checked: int
    breaks: tuple[TemplateBreak, ...]

    def summary(self) -> str:
        if self.append_only:
            return f"append-only over {self.turns_checked} turn transitions"
        lines = [f"not append-only: {len(self.breaks)} of {self.turns_checked} transitions break"]
        return "\n".join(lines + [f"  - {b.describe()}" for b in self.breaks])


def check_append_only(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    end_of_turn_ids: Sequence[int] | None = None,
) -> TemplateReport:
    """Render every assistant turn of `messages` and compare consecutive prompts."""
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if len(assistant_at) < 2:
        raise ValueError("check_append_only needs a conversation with at least two assistant turns")
    eot = set(end_of_turn_ids) if end_of_turn_ids is not None else _end_of_turn_ids(tokenizer)
    kwargs = dict(chat_template_kwargs or {})

    def render(upto: int, generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages[:upto]],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **kwargs,
        )
        return list(tokenizer.encode(str(text), add_special_tokens=False))

    breaks: list[TemplateBreak] = []
    previous: list[int] | None = None
    for index in assistant_at:
        prompt = render(index, generation_prompt=True)
        if previous is not None and prompt[: len(previous)] != previous:
            breaks.append(_describe_break(tokenizer, index, previous, prompt))
        full = render(index + 1, generation_prompt=False)
        if full[: len(prompt)] != prompt:
            # The turn itself does not render as prompt + completion.
            breaks.append(_describe_break(tokenizer, index, prompt, full))
            previous = None
            continue
        previous = prompt + _until_end_of_turn(full[len(prompt) :], eot)
    return TemplateReport(
        append_only=not breaks, turns_checked=len(assistant_at) - 1, breaks=tuple(breaks)
    )


def _end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids


def _until_end_of_turn(completion: list[int], eot: set[int]) -> list[int]:
    for i, token in enumerate(completion):
        if token in eot:
            return completion[: i + 1]
    return completion


def _describe_break(
    tokenizer: PreTrainedTokenizerBase, index: int, expected: list[int], actual: list[int]
) -> TemplateBreak:
    position = next(
        (i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
        min(len(expected), len(actual)),
    )
    window = slice(position, position + _CONTEXT_TOKENS)
    return TemplateBreak(
        message_index=index,
        position=position,
        expected=str(tokenizer.decode(expected[window])),
        actual=str(tokenizer.decode(actual[window])),
    )
