"""OpenAI/vLLM wire format for the embedded server: request models and response builders.

Field names follow vLLM's OpenAI server (`return_token_ids`, top-level `prompt_token_ids` for
chat, per-choice `token_ids`, `logprobs.content[i].logprob`, `stop_reason`), plus Ludic's
`policy_version` (the version a reply's first token was sampled under), `policy_version_end`
(its last token's: larger where a weight push landed mid-reply) and `max_think`, so one client
speaks to both. `stream=true` sends the same fields as server-sent-event chunks
(`chat.completion.chunk` / `text_completion`, the prompt ids in the first chunk,
`stream_options.include_usage`). Deliberately unsupported (a 400 says so):
n > 1, top logprobs (chat's top_logprobs, a completions logprobs above 1: only the sampled
token's logprob is returned), and any other sampling field (`SAMPLING_FIELDS_REFUSED`: logit_bias,
penalties, min_p, min_tokens, best_of, echo, ...) set to other than its neutral value, since
ignoring it would sample from another distribution than the one asked for (the embedded engine
refuses them in process too). Other unknown fields are ignored. A nan or inf logprob (a model whose weights hold
nan or inf) is encoded as an error, never as a number: `NonFiniteLogprobs`, a 500 (an error
event mid-stream), since JSON has no nan and a clamped value would be a silent lie.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import PreTrainedTokenizerBase

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.embedded.streaming import CompletionDelta
from ludic.inference.sampling import SamplingConfig
from ludic.inference.unicode_check import check_text


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


# OpenAI/vLLM request fields that change what is sampled, with the value that changes nothing:
# a request setting one to anything else is refused, never served as if it had not asked.
SAMPLING_FIELDS_REFUSED: dict[str, Any] = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "length_penalty": 1,
    "logit_bias": None,
    "min_p": 0,
    "min_tokens": 0,
    "best_of": 1,
    "use_beam_search": False,
    "echo": False,
    "bad_words": None,
    "allowed_token_ids": None,
    "response_format": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "structured_outputs": None,
}


def _neutral(name: str, value: Any) -> bool:
    if value is None or value == SAMPLING_FIELDS_REFUSED[name]:
        return True
    if name == "response_format":  # {"type": "text"} is plain text, as without it
        return isinstance(value, dict) and value.get("type") == "text"
    # Only these three are neutral when empty; an empty guided_json ({}: "any JSON") or
    # structured_outputs still constrains what is sampled.
    return name in _EMPTY_IS_NEUTRAL and value in ({}, [])


_EMPTY_IS_NEUTRAL = frozenset({"logit_bias", "bad_words", "allowed_token_ids"})

TOOL_CHOICES_SERVED = (None, "auto", "none")
"""tool_choice values served: the model may (or may not) call a tool. "required" or a named
function forces a call (vLLM constrains decoding for it); this server cannot, so it refuses."""


class _SamplingFields(BaseModel):
    """Sampling fields shared by chat and text completions (vLLM names), typed strictly as
    OpenAI's API types them: `max_tokens: true` or `"n": "2"` is a 400 naming the field, not
    served as 1 or 2 (pydantic's lax mode reads a bool as a number and a numeric string as
    one, so a client's wrong field was sampled as something it never asked for)."""

    # extra: kept to refuse SAMPLING_FIELDS_REFUSED; strict: floats take ints, nothing else
    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """A field sent as null takes its default, as OpenAI's API (`stream: boolean | null`)
        and vLLM read it: `"logprobs": null` or `"stream": null`, which clients that write
        every field send, was a 400 "Input should be a valid boolean"."""
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}

    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    max_think: int | None = Field(default=None, ge=1)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def unsupported(self) -> str | None:
        """Why this request cannot be served, or None."""
        if self.stream_options is not None and not self.stream:
            return "stream_options can only be set with stream=true"
        if self.n != 1:
            return f"n={self.n} is not supported; send n separate requests (with different seeds)"
        extra = self.model_extra or {}
        refused = [f for f in SAMPLING_FIELDS_REFUSED if not _neutral(f, extra.get(f))]
        if refused:
            set_ = ", ".join(f"{f}={extra[f]!r}" for f in refused)
            return (
                f"{set_}: not supported by this server (only temperature, top_p, top_k, seed, "
                "stop, stop_token_ids, ignore_eos, max_tokens and max_think shape sampling); "
                "leave it out, or serve with vLLM"
            )
        return None

    def sampling(self, default_max_tokens: int, **extras: Any) -> SamplingConfig:
        if self.stop_token_ids:
            extras["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            extras["ignore_eos"] = True
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        check_text(stop, "stop")  # a lone surrogate never matches text: refused, not ignored
        return SamplingConfig(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            stop=tuple(stop),
            seed=self.seed,
            max_think=self.max_think,
            extras=extras,
        )


class ChatCompletionRequest(_SamplingFields):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def unsupported(self) -> str | None:
        if self.top_logprobs:
            return "top_logprobs is not supported; only the sampled token's logprob is returned"
        if self.tool_choice not in TOOL_CHOICES_SERVED:
            return (
                f"tool_choice={self.tool_choice!r}: not supported by this server (it cannot force "
                "a tool call; only tool_choice 'auto' or 'none' is served); leave it out, or "
                "serve with vLLM"
            )
        return super().unsupported()

    def to_chat_request(self, default_max_tokens: int) -> ChatRequest:
        extras = (
            {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        )
        sampling = self.sampling(default_max_tokens, **extras)
        messages = [_text_content(m, i) for i, m in enumerate(self.messages)]
        return ChatRequest(messages=messages, sampling=sampling, tools=self.tools)


def _text_content(message: dict[str, Any], index: int) -> dict[str, Any]:
    """`message` with OpenAI content parts (`[{"type": "text", "text": ...}, ...]`) joined into
    one string, as vLLM gives a text-only model's chat template; ValueError (a 400) naming a
    part that is not text. A chat template fed the list itself failed with a Jinja error
    ("can only concatenate str (not list)") that named neither the part nor the fix."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = []
    for j, part in enumerate(content):
        where = f"messages[{index}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict):
            raise ValueError(
                f"{where} is a {type(part).__name__}, not a content part; send content as a "
                'string or as parts {"type": "text", "text": "..."}'
            )
        if kind == "text" and not isinstance(part.get("text"), str):
            raise ValueError(
                f"{where} is a text part whose 'text' is not a string; send "
                '{"type": "text", "text": "..."}'
            )
        if kind != "text":
            raise ValueError(
                f"{where} is type {kind!r}: this server serves text only; send content as a string "
                'or as parts {"type": "text", "text": "..."}'
            )
        texts.append(part["text"])
    return {**message, "content": "\n".join(texts)}


class CompletionRequest(_SamplingFields):
    """`prompt` as a list of token ids is token-in mode; a string is tokenized as is."""

    prompt: list[int] | str
    logprobs: bool | int | None = None
    """0 or 1 (or true): each sampled token's logprob; more top candidates are refused."""

    def unsupported(self) -> str | None:
        if self.logprobs is not None and not 0 <= self.logprobs <= 1:
            return (
                f"logprobs={self.logprobs} is not supported; only the sampled token's logprob is "
                "returned (token_logprobs; top_logprobs is null): send logprobs 0 or 1"
            )
        return super().unsupported()


def _usage(r: ChatResponse) -> dict[str, int]:
    prompt, completion = len(r.prompt_token_ids), len(r.completion_token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _token_texts(tokenizer: PreTrainedTokenizerBase, ids: tuple[int, ...]) -> list[str]:
    return [str(tokenizer.decode([t])) for t in ids]


class NonFiniteLogprobs(RuntimeError):
    """A sampled token's logprob is nan or inf: the response is failed, not encoded."""


def _finite(logprobs: tuple[float, ...]) -> tuple[float, ...]:
    if not all(math.isfinite(lp) for lp in logprobs):
        raise NonFiniteLogprobs(
            "the model gave a nan or inf logprob for a sampled token, which JSON cannot carry: "
            "its weights likely hold nan or inf (see /ludic/weights/status); push finite weights"
        )
    return logprobs


def _chat_logprobs(
    tokenizer: PreTrainedTokenizerBase, ids: tuple[int, ...], logprobs: tuple[float, ...]
) -> dict[str, Any]:
    logprobs = _finite(logprobs)
    texts = _token_texts(tokenizer, ids)
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(texts, logprobs, strict=True)
        ]
    }


def _text_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    ids: tuple[int, ...],
    logprobs: tuple[float, ...],
    offset: int = 0,
) -> dict[str, Any]:
    """Completions-style logprobs; `text_offset` counts from `offset` (the text already sent)."""
    logprobs = _finite(logprobs)
    texts = _token_texts(tokenizer, ids)
    return {
        "tokens": texts,
        "token_logprobs": list(logprobs),
        "top_logprobs": None,
        "text_offset": list(itertools.accumulate((len(t) for t in texts[:-1]), initial=offset)),
    }


def _choice_end(r: ChatResponse | None) -> dict[str, Any]:
    return {
        "finish_reason": None if r is None else r.finish_reason,
        "stop_reason": None if r is None else r.extra.get("stop_reason"),
    }


def _versions(r: ChatResponse) -> dict[str, int | None]:
    """The policy versions a reply was sampled under: its first token's and its last token's.
    They differ when a weight push landed mid-reply, so the completion mixes two policies
    (OpenAI clients ignore both fields)."""
    end = r.extra.get("policy_version_end", r.policy_version)
    return {"policy_version": r.policy_version, "policy_version_end": end}


def chat_completion_body(
    r: ChatResponse, req: ChatCompletionRequest, model: str, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": r.text, "tool_calls": []},
        "logprobs": None,
        **_choice_end(r),
    }
    if req.logprobs and r.completion_logprobs is not None:
        choice["logprobs"] = _chat_logprobs(
            tokenizer, r.completion_token_ids, r.completion_logprobs
        )
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(r),
        **_versions(r),
    }
    if req.return_token_ids:
        choice["token_ids"] = list(r.completion_token_ids)
        body["prompt_token_ids"] = list(r.prompt_token_ids)
    return body


def completion_body(
    r: ChatResponse, req: CompletionRequest, model: str, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": r.text, "logprobs": None, **_choice_end(r)}
    if req.logprobs is not None and r.completion_logprobs is not None:
        choice["logprobs"] = _text_logprobs(
            tokenizer, r.completion_token_ids, r.completion_logprobs
        )
    if req.return_token_ids:
        choice["token_ids"] = list(r.completion_token_ids)
        choice["prompt_token_ids"] = list(r.prompt_token_ids)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(r),
        **_versions(r),
    }


class ChunkWriter:
    """The server-sent-event chunks of one streamed chat or text completion, in vLLM's
    streaming format: one chunk per delta (text, its token ids and logprobs when asked), the
    last with `finish_reason` and the policy versions, then a usage chunk if asked, then
    `[DONE]`."""

    def __init__(
        self,
        req: ChatCompletionRequest | CompletionRequest,
        model: str,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        self.req, self.tokenizer = req, tokenizer
        self.chat = isinstance(req, ChatCompletionRequest)
        self.head = {
            "id": f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self.offset = 0  # characters of the token texts so far (`text_offset`, as unstreamed)

    def delta(self, text: str, delta: CompletionDelta) -> str:
        """The chunk for one delta (the first one opens the assistant message)."""
        r, ids, logprobs = delta.response, delta.token_ids, delta.logprobs
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            opening = {"role": "assistant"} if delta.prompt_token_ids else {}
            choice["delta"] = {**opening, "content": text}
            wanted = bool(self.req.logprobs and ids)
            choice["logprobs"] = _chat_logprobs(self.tokenizer, ids, logprobs) if wanted else None
        else:
            choice["text"] = text
            choice["logprobs"] = None
            if self.req.logprobs is not None and ids:
                lp = _text_logprobs(self.tokenizer, ids, logprobs, self.offset)
                self.offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
                choice["logprobs"] = lp
        choice.update(_choice_end(r))
        body: dict[str, Any] = {**self.head, "choices": [choice]}
        if self.req.return_token_ids:
            choice["token_ids"] = list(ids)
            if delta.prompt_token_ids:
                target = body if self.chat else choice
                target["prompt_token_ids"] = list(delta.prompt_token_ids)
        if r is not None:
            body.update(_versions(r))
        return _event(body)

    def usage(self, r: ChatResponse) -> str:
        return _event({**self.head, "choices": [], "usage": _usage(r)})

    @staticmethod
    def error(status: int, message: str) -> str:
        return _event(error_body(status, message))

    @staticmethod
    def done() -> str:
        return "data: [DONE]\n\n"


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"


_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    # Statuses the `openai` SDK has no exception of its own for, named after their HTTP reason
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    413: "PayloadTooLargeError",
    499: "ClientClosedRequestError",
}
"""The `openai` SDK's exception names for these statuses (vLLM's server names its errors so):
a 413 called a BadRequestError sent a client looking for a malformed field, not a size."""


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI-style error payload; a 4xx named nowhere above is the SDK's `APIStatusError`."""
    fallback = "APIStatusError" if status < 500 else "InternalServerError"
    kind = _ERROR_TYPES.get(status, fallback)
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
