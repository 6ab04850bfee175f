"""A server that answers 200 with something that is not a well-formed completion: the client
raises `InferenceResponseError` naming the problem, once (no retry), so that episode fails
with that message. Before: a KeyError or IndexError with no word of the server, or, for values
of the wrong kind (token ids as strings or bools, a nan logprob, a policy version "v3"), no
error at all: they went into the rollout and on to the trainer."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest

from ludic.inference import ChatRequest
from ludic.inference.http.openai_client import InferenceResponseError, OpenAICompatibleClient

REPLY: dict[str, Any] = {
    "choices": [
        {
            "message": {"role": "assistant", "content": "hi"},
            "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
            "finish_reason": "stop",
            "token_ids": [7, 8],
        }
    ],
    "prompt_token_ids": [1, 2, 3],
    "policy_version": 4,
}
CHOICE = ("choices", 0)


def changed(path: tuple[Any, ...], value: Any) -> bytes:
    reply = copy.deepcopy(REPLY)
    target = reply
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(reply).encode()


HOSTILE = [
    (b"<html>502 Bad Gateway</html>", "a 200 whose body is not a JSON object: '<html>502"),
    (b"[1, 2]", "a 200 whose body is not a JSON object"),
    (b"{}", "KeyError: 'choices'"),
    (b'{"choices": []}', "IndexError"),
    (changed((*CHOICE, "token_ids"), ["7", "8"]), "completion token ids hold '7', not an int >= 0"),
    (changed((*CHOICE, "token_ids"), [True, 8]), "completion token ids hold True"),
    (changed((*CHOICE, "token_ids"), [-7, 8]), "completion token ids hold -7"),
    (changed(("prompt_token_ids",), [1, None]), "prompt token ids hold None"),
    (changed((*CHOICE, "logprobs", "content", 0, "logprob"), "x"), "ValueError"),
    (
        changed((*CHOICE, "logprobs", "content", 0, "logprob"), float("nan")),
        "logprob is nan or inf",
    ),
    (changed(("policy_version",), "v3"), "its policy version is 'v3', not an int >= 0"),
    (changed((*CHOICE, "message", "content"), ["a"]), "its text is a list, not a string"),
    (changed((*CHOICE, "message", "tool_calls"), [{"function": {}}]), "KeyError: 'name'"),
]


@pytest.mark.parametrize(("body", "problem"), HOSTILE)
async def test_a_malformed_reply_is_an_error_naming_the_server_and_the_problem(
    body: bytes, problem: str
) -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, content=body, headers={"Content-Type": "application/json"})

    transport = httpx.MockTransport(handler)
    async with OpenAICompatibleClient("http://test", "m", transport=transport) as client:
        with pytest.raises(InferenceResponseError) as caught:
            await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
    message = str(caught.value)
    assert message.startswith("the server at http://test/v1/chat/completions answered with a ")
    assert problem in message and len(calls) == 1


async def test_a_policy_version_header_that_is_no_int_is_named() -> None:
    reply = {k: v for k, v in REPLY.items() if k != "policy_version"}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=reply, headers={"X-Ludic-Policy-Version": "latest"})

    transport = httpx.MockTransport(handler)
    async with OpenAICompatibleClient("http://test", "m", transport=transport) as client:
        with pytest.raises(InferenceResponseError, match="invalid literal for int"):
            await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
        good = copy.deepcopy(REPLY)
        transport.handler = lambda request: httpx.Response(200, json=good)  # type: ignore[attr-defined]
        r = await client.complete(ChatRequest(messages=[{"role": "user", "content": "q"}]))
    assert r.completion_token_ids == (7, 8) and r.policy_version == 4
