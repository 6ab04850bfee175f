"""OpenAI/vLLM wire format for the embedded server: request models and response builders.

Field names follow vLLM's OpenAI server (`return_token_ids`, top-level `prompt_token_ids` for
chat, per-choice `token_ids`, `logprobs.content[i].logprob`, `stop_reason`), plus Ludic's
`policy_version` and `max_think`, so one client speaks to both. Deliberately unsupported (a 400
says so): streaming, n > 1, top_logprobs, logit_bias, penalties.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedTokenizerBase

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.sampling import SamplingConfig


class _SamplingFields(BaseModel):
    """Sampling fields shared by chat and text completions (vLLM names)."""

    model_config = ConfigDict(extra="ignore")

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
    return_token_ids: bool = False

    def unsupported(self) -> str | None:
        """Why this request cannot be served, or None."""
        if self.stream:
            return "stream=true is not supported by the embedded server; send stream=false"
        if self.n != 1:
            return f"n={self.n} is not supported; send n separate requests (with different seeds)"
        return None

    def sampling(self, default_max_tokens: int, **extras: Any) -> SamplingConfig:
        if self.stop_token_ids:
            extras["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            extras["ignore_eos"] = True
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
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

    def unsupported(self) -> str | None:
        if self.top_logprobs:
            return "top_logprobs is not supported; only the sampled token's logprob is returned"
        return super().unsupported()

    def to_chat_request(self, default_max_tokens: int) -> ChatRequest:
        extras = (
            {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        )
        sampling = self.sampling(default_max_tokens, **extras)
        return ChatRequest(messages=self.messages, sampling=sampling, tools=self.tools)


class CompletionRequest(_SamplingFields):
    """`prompt` as a list of token ids is token-in mode; a string is tokenized as is."""

    prompt: list[int] | str
    logprobs: int | None = None


def _usage(r: ChatResponse) -> dict[str, int]:
    prompt, completion = len(r.prompt_token_ids), len(r.completion_token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _token_texts(tokenizer: PreTrainedTokenizerBase, ids: tuple[int, ...]) -> list[str]:
    return [str(tokenizer.decode([t])) for t in ids]


def chat_completion_body(
    r: ChatResponse, req: ChatCompletionRequest, model: str, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": r.text, "tool_calls": []},
        "logprobs": None,
        "finish_reason": r.finish_reason,
        "stop_reason": r.extra.get("stop_reason"),
    }
    if req.logprobs and r.completion_logprobs is not None:
        texts = _token_texts(tokenizer, r.completion_token_ids)
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(texts, r.completion_logprobs, strict=True)
            ]
        }
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(r),
        "policy_version": r.policy_version,
    }
    if req.return_token_ids:
        choice["token_ids"] = list(r.completion_token_ids)
        body["prompt_token_ids"] = list(r.prompt_token_ids)
    return body


def completion_body(
    r: ChatResponse, req: CompletionRequest, model: str, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "text": r.text,
        "logprobs": None,
        "finish_reason": r.finish_reason,
        "stop_reason": r.extra.get("stop_reason"),
    }
    if req.logprobs is not None and r.completion_logprobs is not None:
        texts = _token_texts(tokenizer, r.completion_token_ids)
        offsets = list(itertools.accumulate((len(t) for t in texts[:-1]), initial=0))
        choice["logprobs"] = {
            "tokens": texts,
            "token_logprobs": list(r.completion_logprobs),
            "top_logprobs": None,
            "text_offset": offsets,
        }
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
        "policy_version": r.policy_version,
    }


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI-style error payload."""
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
