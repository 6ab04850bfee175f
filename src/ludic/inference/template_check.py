"""Chat-template conformance: is a template append-only over a multi-turn conversation?

Append-only means each assistant turn's prompt ids start with the previous turn's prompt ids
plus that turn's completion ids (as the template renders it, up to the end-of-turn token), so
a whole episode can be trained as one token sequence. Templates that rewrite history (Qwen3
dropping earlier `<think>` blocks, date stamps, ...) break it; the report says where, and the
sample builder then splits samples at each break (template drift, `num_drift_splits`).
`warn_if_not_append_only` runs the check once per template on a probe conversation shaped like
Ludic's agents (thinking, a tool call, its result) and logs a warning; the embedded engine
calls it at start. It checks token ids only and does not judge whether a template is otherwise
correct.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ludic.types import Message

_CONTEXT_TOKENS = 12

logger = logging.getLogger(__name__)

PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
_PROBE_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
}
# What Ludic's agents send over an episode: thinking, a tool call and its result, more turns.
PROBE_CONVERSATION: tuple[Message, ...] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<think>I add them.</think>", "tool_calls": [_PROBE_CALL]},
    {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "5"},
    {"role": "assistant", "content": "<think>The tool says 5.</think>The answer is 5."},
    {"role": "user", "content": "And 5 + 5?"},
    {"role": "assistant", "content": "<think>Easy.</think>10"},
)
_checked: dict[str, TemplateReport | None] = {}


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


def warn_if_not_append_only(
    tokenizer: PreTrainedTokenizerBase,
    *,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> TemplateReport | None:
    """Check `tokenizer`'s chat template on `PROBE_CONVERSATION` (with `PROBE_TOOL`) once per
    template and log a warning naming the break when it is not append-only.

    Returns the report, or None when the template cannot render the probe (no chat template,
    or one without tool or system turns); that is logged at info level, never raised.
    """
    key = repr(
        (getattr(tokenizer, "chat_template", None), sorted((chat_template_kwargs or {}).items()))
    )
    if key in _checked:
        return _checked[key]
    report = _probe(tokenizer, chat_template_kwargs)
    _checked[key] = report
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if report is not None and not report.append_only:
        logger.warning(
            "the chat template of %s is not append-only: %s\nEach model call of an episode "
            "whose prompt does not extend the previous call's tokens starts a new training "
            "sample there (an exact split, counted in BatchStats.num_drift_splits, not a "
            "snapshot), so long episodes train as many short sequences. Use a template that "
            "renders every earlier turn unchanged (for Qwen3: one that keeps earlier <think> "
            "blocks) to train each turn as one sequence.",
            name,
            report.summary(),
        )
    return report


def _probe(
    tokenizer: PreTrainedTokenizerBase, chat_template_kwargs: Mapping[str, Any] | None
) -> TemplateReport | None:
    if getattr(tokenizer, "chat_template", None) is None:
        logger.info("no chat template on %s: append-only check skipped", type(tokenizer).__name__)
        return None
    without_tools = [
        m for m in PROBE_CONVERSATION if m["role"] != "tool" and not m.get("tool_calls")
    ]
    attempts = ((list(PROBE_CONVERSATION), [PROBE_TOOL]), (without_tools, None))
    problem: Exception | None = None
    for messages, tools in attempts:
        try:
            return check_append_only(
                tokenizer, messages, tools=tools, chat_template_kwargs=chat_template_kwargs
            )
        except Exception as e:  # a template may refuse tools or system turns
            problem = e
    logger.info(
        "the chat template could not render the append-only probe (%s): check skipped", problem
    )
    return None
