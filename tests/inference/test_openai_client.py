"""OpenAICompatibleClient against a mock transport: request bodies, parsing, retries, errors."""

from __future__ import annotations

import json

import httpx
import pytest

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.http.openai_client import (
    InferenceRequestError,
    InferenceUnavailableError,
    OpenAICompatibleClient,
)

CHAT_REPLY = {
    "choices": [
        {
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": {
                "content": [{"token": "h", "logprob": -0.5}, {"token": "i", "logprob": -0.25}]
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [7, 8],
        }
    ],
    "prompt_token_ids": [1, 2, 3],
    "policy_version": 4,
}


def client_with(handler: object, **kwargs: object) -> OpenAICompatibleClient:
    return OpenAICompatibleClient(
        "http://test/v1",
        "m",
        api_key="k",
        transport=httpx.MockTransport(handler),
        backoff_s=0.001,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_chat_request_body_and_parsing() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer k"
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=CHAT_REPLY)

    async with client_with(handler) as client:
        sampling = SamplingConfig(max_tokens=5, seed=3, top_k=4, max_think=2, stop=("x",))
        r = await client.complete(
            ChatRequest(messages=[{"role": "user", "content": "q"}], sampling=sampling)
        )
    body = seen[0]
    assert body["return_token_ids"] is True and body["logprobs"] is True
    assert (
        body["top_k"] == 4
        and body["max_think"] == 2
        and body["seed"] == 3
        and body["stop"] == ["x"]
    )
    assert "extra_body" not in body
    assert r.prompt_token_ids == (1, 2, 3) and r.completion_token_ids == (7, 8)
    assert r.completion_logprobs == (-0.5, -0.25) and r.policy_version == 4 and r.text == "hi"
    assert r.trace() is not None


async def test_token_in_uses_completions_endpoint() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert (
            request.url.path == "/v1/completions"
            and body["prompt"] == [5, 6]
            and body["logprobs"] == 0
        )
        choice = {
            "text": "a",
            "token_ids": [9],
            "prompt_token_ids": [5, 6],
            "finish_reason": "length",
            "logprobs": {"token_logprobs": [-1.0]},
        }
        return httpx.Response(200, json={"choices": [choice]})

    async with client_with(handler) as client:
        r = await client.complete(ChatRequest(messages=[], prompt_token_ids=[5, 6]))
    assert (
        r.prompt_token_ids == (5, 6)
        and r.completion_token_ids == (9,)
        and r.completion_logprobs == (-1.0,)
    )
    assert r.finish_reason == "length" and r.policy_version is None


async def test_retries_5xx_and_connection_errors_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
        if len(calls) == 2:
            return httpx.Response(503, json={"error": {"message": "warming up"}})
        return httpx.Response(200, json=CHAT_REPLY)

    async with client_with(handler) as client:
        r = await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
    assert len(calls) == 3 and r.completion_token_ids == (7, 8)


async def test_gives_up_after_max_retries_with_last_problem() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": {"message": "boom"}})

    async with client_with(handler, max_retries=2) as client:
        with pytest.raises(InferenceUnavailableError, match="3 attempts: 500: boom"):
            await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))


async def test_4xx_raises_at_once_with_the_server_message() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(400, json={"error": {"message": "n=2 is not supported"}})

    async with client_with(handler) as client:
        with pytest.raises(InferenceRequestError, match="n=2 is not supported") as info:
            await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
    assert info.value.status_code == 400 and len(calls) == 1


async def test_mismatched_ids_and_logprobs_are_an_error() -> None:
    bad = json.loads(json.dumps(CHAT_REPLY))
    bad["choices"][0]["token_ids"] = [7]

    async with client_with(lambda request: httpx.Response(200, json=bad)) as client:
        with pytest.raises(ValueError, match="1 token ids but 2 logprobs"):
            await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))


async def test_server_without_ids_gives_no_trace() -> None:
    plain = {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    async with client_with(lambda request: httpx.Response(200, json=plain)) as client:
        r = await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
    assert r.text == "ok" and r.trace() is None
