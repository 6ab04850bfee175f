"""Turning a ChatRequest into prompt ids and a validated SequenceState for the embedded engine.

The chat template is rendered once to text (with the request's tools) and tokenized without
adding special tokens, as vLLM does; token-in requests use their ids verbatim. Sampling extras
the engine does not implement are refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ludic.inference.client import ChatRequest
from ludic.inference.sequence import SequenceState
from ludic.types import Message

SUPPORTED_EXTRAS = ("stop_token_ids", "ignore_eos", "chat_template_kwargs")


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Prompt ids for `messages` with the assistant generation prompt appended."""
    if not messages:
        raise ValueError("a chat request needs at least one message (or prompt_token_ids)")
    try:
        text = tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=True,
            tokenize=False,
            **dict(chat_template_kwargs or {}),
        )
    except Exception as e:
        raise ValueError(f"the chat template failed on these messages: {e}") from e
    return list(tokenizer.encode(str(text), add_special_tokens=False))


def build_sequence(
    request: ChatRequest,
    *,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    vocab_size: int,
    max_model_len: int,
    seed: int,
    on_done: Callable[[SequenceState], None] | None = None,
    on_token: Callable[[SequenceState], None] | None = None,
) -> SequenceState:
    """Validate `request` and build its engine state; raises ValueError naming the problem."""
    cfg = request.sampling
    unknown = sorted(set(cfg.extras) - set(SUPPORTED_EXTRAS))
    if unknown:
        raise ValueError(
            f"the embedded engine does not support sampling extras {unknown}; "
            f"supported extras: {list(SUPPORTED_EXTRAS)}"
        )
    vocab = vocab_size
    if cfg.max_think is not None and cfg.max_think < 1:
        raise ValueError(f"max_think must be >= 1 (or None for no cap), got {cfg.max_think}")
    if request.prompt_token_ids is not None:
        prompt_ids = _checked_ids(request.prompt_token_ids, vocab, "prompt_token_ids")
    else:
        prompt_ids = render_prompt_ids(
            tokenizer, request.messages, request.tools, cfg.extras.get("chat_template_kwargs")
        )
    room = max_model_len - len(prompt_ids)
    if room <= 0:
        raise ValueError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context is {max_model_len} "
            "tokens; shorten the conversation (or raise EngineConfig.max_model_len)"
        )
    stop_token_ids = frozenset(
        _checked_ids(
            cfg.extras.get("stop_token_ids", ()), vocab, "stop_token_ids", allow_empty=True
        )
    )
    return SequenceState(
        prompt_ids=prompt_ids,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        max_tokens=min(cfg.max_tokens, room),
        generator=torch.Generator().manual_seed(seed),
        eos_ids=frozenset() if cfg.extras.get("ignore_eos") else eos_ids,
        stop_token_ids=stop_token_ids,
        stop=tuple(s for s in cfg.stop if s),
        max_think=cfg.max_think,
        on_done=on_done,
        on_token=on_token,
    )


def _checked_ids(
    ids: Sequence[int], vocab: int, what: str, *, allow_empty: bool = False
) -> list[int]:
    if isinstance(ids, str | bytes):
        raise ValueError(f"{what} must be a list of token ids, got a string")
    out: list[int] = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"{what} must hold integers, got {t!r}")
        if not 0 <= t < vocab:
            raise ValueError(f"{what} holds token id {t}, outside the vocabulary [0, {vocab})")
        out.append(t)
    if not out and not allow_empty:
        raise ValueError(f"{what} is empty: a prompt needs at least one token")
    return out
