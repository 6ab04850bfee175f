"""Turning a ChatRequest into prompt ids and a validated SequenceState for the embedded engine.

The chat template is rendered once to text (with the request's tools) and tokenized without
adding special tokens, as vLLM does (a text completion prompt gets them: `encode_prompt_text`'s
`add_special_tokens`); token-in requests use their ids verbatim. Sampling extras
the engine does not implement are refused rather than silently ignored. `build_sequence` is the
one admission check both the in-process and the HTTP path go through: every length within the
context, ids within the vocabulary, stop rules bounded (the field ranges are `SamplingConfig`'s),
so a request that passes cannot fail the batch it joins. Text with a lone surrogate is refused
naming where it is, and a text far over the context is refused from the tokens of its head (never
tokenized whole). It does not tokenize cheaply: callers run it off the event loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ludic.inference.client import ChatRequest
from ludic.inference.embedded.sequence import SequenceState
from ludic.inference.sampling import SamplingConfig
from ludic.inference.unicode_check import check_text
from ludic.types import Message

SUPPORTED_EXTRAS = ("stop_token_ids", "ignore_eos", "chat_template_kwargs")
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 512  # each stop string's tail is decoded at every step
MAX_STOP_TOKEN_IDS = 1024
# Arguments the engine sets itself; `chat_template` would run a client's own Jinja template.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"chat_template", "conversation", "tools", "add_generation_prompt", "tokenize"}
)
# Tokens a cut through a word may add to a text's head over what the whole text has there.
HEAD_SLACK_TOKENS = 16
_CUT_WINDOW_CHARS = 4096  # how far past the head's end a space to cut at is looked for
_FIRST_HEAD_CHARS_PER_TOKEN = 8  # twice typical text's: one head refuses most long prompts
_chars_per_token: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, int] = (
    weakref.WeakKeyDictionary()
)


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    *,
    max_model_len: int | None = None,
    model_len: int | None = None,
) -> list[int]:
    """Prompt ids for `messages` with the assistant generation prompt appended. With
    `max_model_len`, a rendered prompt far over it is refused without tokenizing it whole
    (`encode_prompt_text`; `model_len` as there)."""
    if not messages:
        raise ValueError("a chat request needs at least one message (or prompt_token_ids)")
    check_text(list(messages), "messages")
    check_text(list(tools or ()), "tools")
    check_text(dict(chat_template_kwargs or {}), "chat_template_kwargs")
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
    return encode_prompt_text(
        tokenizer, str(text), max_model_len, where="the rendered prompt", model_len=model_len
    )


def encode_prompt_text(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    max_model_len: int | None = None,
    *,
    where: str = "the prompt",
    add_special_tokens: bool = False,
    model_len: int | None = None,
) -> list[int]:
    """`text`'s ids; ValueError for a lone surrogate in it, and, with `max_model_len`, for a
    text whose head alone holds the context's worth of tokens (`model_len`: the model's own
    context where `max_model_len` caps it lower, which the refusal offers to raise). `add_special_tokens`: add the
    tokenizer's own (a Llama-style BOS) as `tokenizer.encode(text)` and vLLM do for a text
    completion prompt; a rendered chat template keeps the default False (it holds its BOS).

    Heads are cut at a space, from 8 characters a token up to `max_chars_per_token`: unless
    the tokenizer drops or merges characters, the last holds more tokens than the context, so
    refusing a multi-megabyte prompt tokenizes at most twice `max_chars_per_token` characters
    for each token of context (typical text: one head). A tokenizer that packs more characters
    into a token than its vocabulary shows only loses the shortcut: its text is tokenized whole.
    """
    check_text(text, where)
    if max_model_len is not None:
        _refuse_a_head_over(tokenizer, text, max_model_len, add_special_tokens, model_len)
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def max_chars_per_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters one token of `tokenizer` spells out (cached per tokenizer): its
    longest vocabulary entry, which for byte-level BPE counts bytes, at least the characters."""
    cached = _chars_per_token.get(tokenizer)
    if cached is None:
        cached = max((len(token) for token in tokenizer.get_vocab()), default=1)
        _chars_per_token[tokenizer] = cached
    return max(cached, 1)


def _refuse_a_head_over(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    max_model_len: int,
    add_special_tokens: bool = False,
    model_len: int | None = None,
) -> None:
    """Tokenize heads of `text` twice as long each time, from `_FIRST_HEAD_CHARS_PER_TOKEN`
    characters a token (so typical text is refused from one short head) up to the most a token
    can spell; a text no longer than that is left to be tokenized whole. Heads get the special
    tokens the whole text would, so the count includes them."""
    tokens = max_model_len + HEAD_SLACK_TOKENS
    most_chars = tokens * max_chars_per_token(tokenizer)
    size = min(tokens * _FIRST_HEAD_CHARS_PER_TOKEN, most_chars)
    while size < len(text):
        space = text.find(" ", size, size + _CUT_WINDOW_CHARS)
        head = text[: size if space < 0 else space]  # a cut before a space splits no word
        head_ids = tokenizer.encode(head, add_special_tokens=add_special_tokens)
        at_least = len(head_ids) - HEAD_SLACK_TOKENS
        if at_least >= max_model_len:
            counted = (len(head), len(text))
            raise _too_long(at_least, max_model_len, model_len, counted=counted)
        if size >= most_chars:  # it packs more characters in a token than its vocabulary shows
            return
        size = min(2 * size, most_chars)


def build_sequence(
    request: ChatRequest,
    *,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: frozenset[int],
    vocab_size: int,
    max_model_len: int,
    model_len: int | None = None,
    seed: int,
    on_done: Callable[[SequenceState], None] | None = None,
    on_token: Callable[[SequenceState], None] | None = None,
) -> SequenceState:
    """Validate `request` and build its engine state; raises ValueError naming the problem.
    `model_len`: the model's own context where `max_model_len` caps it lower."""
    cfg = request.sampling
    _check_limits(cfg, max_model_len)
    if request.prompt_token_ids is not None:
        given = request.prompt_token_ids
        if isinstance(given, Sized) and len(given) >= max_model_len:  # before reading each id
            raise _too_long(len(given), max_model_len, model_len)
        prompt_ids = _checked_ids(request.prompt_token_ids, vocab_size, "prompt_token_ids")
    else:
        prompt_ids = render_prompt_ids(
            tokenizer,
            request.messages,
            request.tools,
            cfg.extras.get("chat_template_kwargs"),
            max_model_len=max_model_len,
            model_len=model_len,
        )
    room = max_model_len - len(prompt_ids)
    if room <= 0:
        raise _too_long(len(prompt_ids), max_model_len, model_len)
    stop_token_ids = frozenset(
        _checked_ids(
            cfg.extras.get("stop_token_ids", ()), vocab_size, "stop_token_ids", allow_empty=True
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


def _check_limits(cfg: SamplingConfig, max_model_len: int) -> None:
    """`SamplingConfig`'s own ranges, and what the engine needs beyond them."""
    cfg.validate()
    unknown = sorted(set(cfg.extras) - set(SUPPORTED_EXTRAS))
    if unknown:
        raise ValueError(
            f"the embedded engine does not support sampling extras {unknown}; "
            f"supported extras: {list(SUPPORTED_EXTRAS)}"
        )
    for name, value in (("max_tokens", cfg.max_tokens), ("max_think", cfg.max_think)):
        if value is not None and value > max_model_len:
            raise ValueError(
                f"{name}={value} exceeds the model's context of {max_model_len} tokens"
            )
    if len(cfg.stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop holds {len(cfg.stop)} strings; at most {MAX_STOP_STRINGS}")
    if any(len(s) > MAX_STOP_CHARS for s in cfg.stop):
        raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters long")
    stop_ids = cfg.extras.get("stop_token_ids", ())
    if isinstance(stop_ids, Sized) and len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(f"stop_token_ids holds {len(stop_ids)} ids; at most {MAX_STOP_TOKEN_IDS}")
    if not isinstance(cfg.extras.get("ignore_eos", False), bool):
        raise ValueError(f"ignore_eos must be true or false, got {cfg.extras['ignore_eos']!r}")
    template_kwargs = cfg.extras.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, Mapping):
        raise ValueError(f"chat_template_kwargs must be an object, got {template_kwargs!r}")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs))
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {reserved}: the engine sets them")


def _too_long(
    n: int, max_model_len: int, model_len: int | None, *, counted: tuple[int, int] | None = None
) -> ValueError:
    """`counted`: (characters tokenized, characters in all) when only the head was counted.
    Raising the context is offered only below `model_len`, the model's own: past it the model
    never saw the positions (`ludic serve --max-model-len` refuses it; ludic train, eval and
    actor have no such flag), and the advice sent users to a refusal or a flag that is not
    there."""
    has = (
        f"{n} tokens"
        if counted is None
        else (
            f"at least {n} tokens (counted in its first {counted[0]:,} of {counted[1]:,} "
            "characters; the rest was not tokenized)"
        )
    )
    if model_len is None or model_len <= max_model_len:
        return ValueError(
            f"the prompt has {has} but the model's context is {max_model_len} tokens; "
            "shorten the conversation (or its system prompt and tool list), or use a model "
            "with a longer context"
        )
    return ValueError(
        f"the prompt has {has} but the model's context is {max_model_len} tokens here, capped "
        f"below its own {model_len}; shorten the conversation, or raise the cap up to "
        f"{model_len} (`ludic serve`: --max-model-len; in Python: EngineConfig.max_model_len)"
    )


def _checked_ids(
    ids: Sequence[int], vocab: int, what: str, *, allow_empty: bool = False
) -> list[int]:
    if isinstance(ids, str | bytes):
        raise ValueError(f"{what} must be a list of token ids, got a string")
    if not isinstance(ids, Sequence):
        raise ValueError(f"{what} must be a list of token ids, got {type(ids).__name__}")
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
