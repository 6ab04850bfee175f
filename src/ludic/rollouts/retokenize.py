"""Opt-in retokenization: rebuild a step's token trace from its messages with a chat template.

Only for backends that return no token ids. The ids may differ from what the server sampled
(templates and tokenizers drift), and there are no behaviour logprobs, so training on them is
off-policy in ways nothing here can detect. Token-in mode (backend ids) is always preferred.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ludic.types import AgentStep, Message, TokenTrace


class ChatTemplateTokenizer(Protocol):
    """The part of a Hugging Face tokenizer that retokenization uses."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> Any: ...


class Retokenizer(Protocol):
    """Builds a TokenTrace for an agent step that may have none."""

    def trace(self, step: AgentStep) -> TokenTrace: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ChatTemplateRetokenizer:
    """Retokenizes a step as `template(prompt_messages + [assistant completion])`.

    Prompt ids are `template(prompt_messages, add_generation_prompt=True)`. Completion ids are
    the rest of the full rendering when the prompt rendering is its prefix (so they include the
    template's end-of-turn tokens, as a sampled completion does), else `encode(completion)`.
    `tools` are the tool schemas the agent was given (templates render them into the prompt).
    """

    tokenizer: ChatTemplateTokenizer
    tools: Sequence[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def trace(self, step: AgentStep) -> TokenTrace:
        if not step.prompt_messages:
            raise ValueError(
                f"cannot retokenize AgentStep {step.id}: it recorded no prompt_messages"
            )
        prompt = list(step.prompt_messages)
        prompt_ids = self._render(prompt, add_generation_prompt=True)
        full_ids = self._render([*prompt, _assistant_message(step)], add_generation_prompt=False)
        if full_ids[: len(prompt_ids)] == prompt_ids:
            completion_ids = full_ids[len(prompt_ids) :]
        else:
            completion_ids = _ids(self.tokenizer.encode(step.completion, add_special_tokens=False))
        return TokenTrace(prompt_token_ids=prompt_ids, completion_token_ids=completion_ids)

    def _render(self, messages: list[Message], *, add_generation_prompt: bool) -> tuple[int, ...]:
        out = self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            return_dict=False,
            **self.template_kwargs,
        )
        return _ids(out)


def _assistant_message(step: AgentStep) -> Message:
    message: Message = {"role": "assistant", "content": step.completion}
    if step.tool_calls:
        message["tool_calls"] = [t.to_message_part() for t in step.tool_calls]
    return message


def _ids(out: Any) -> tuple[int, ...]:
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        raise ValueError("retokenize: the tokenizer returned a batch; expected one sequence")
    return tuple(int(t) for t in out)
