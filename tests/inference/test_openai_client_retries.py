"""Which failures OpenAICompatibleClient resends (a request the server never started, or lost)
and which it never does (a read timeout: the server may still be generating), on a mock
transport. The real-server side is in test_server_bad_input.py."""

from __future__ import annotations

import httpx
import pytest
from test_openai_client import CHAT_REPLY, client_with

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.http.openai_client import (
    InferenceRequestError,
    InferenceTimeoutError,
    InferenceUnavailableError,
)

REQUEST = ChatRequest(
    messages=[{"role": "user", "content": "q"}], sampling=SamplingConfig(max_tokens=4)
)


def failing_then_ok(failure: httpx.TransportError | httpx.Response) -> tuple[object, list[int]]:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            if isinstance(failure, httpx.Response):
                return failure
            raise failure
        return httpx.Response(200, json=CHAT_REPLY)

    return handler, calls


async def test_a_read_timeout_is_not_resent_and_says_which_knob_to_raise() -> None:
    handler, calls = failing_then_ok(httpx.ReadTimeout("timed out"))
    async with client_with(handler, max_retries=5, timeout=7.5) as client:
        with pytest.raises(InferenceTimeoutError) as raised:
            await client.complete(REQUEST)
    assert len(calls) == 1
    message = str(raised.value)
    assert "read timeout of 7.5 s" in message and "OpenAICompatibleClient(timeout=...)" in message
    # its own error, not InferenceUnavailableError (a pool moves it: test_pool_timeout.py)
    assert not isinstance(raised.value, InferenceUnavailableError)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("refused"),
        httpx.ConnectTimeout("no connection"),
        httpx.RemoteProtocolError("server closed the connection"),
        httpx.Response(429, json={"error": {"message": "slow down"}}),
        httpx.Response(503, json={"error": {"message": "closed"}}),
    ],
    ids=["connect-error", "connect-timeout", "connection-lost", "429", "503"],
)
async def test_a_request_never_started_or_lost_is_resent(
    failure: httpx.TransportError | httpx.Response,
) -> None:
    handler, calls = failing_then_ok(failure)
    async with client_with(handler, max_retries=2) as client:
        assert (await client.complete(REQUEST)).text == "hi"
    assert len(calls) == 2


async def test_a_400_is_not_resent() -> None:
    handler, calls = failing_then_ok(httpx.Response(400, json={"error": {"message": "bad"}}))
    async with client_with(handler, max_retries=5) as client:
        with pytest.raises(InferenceRequestError, match="bad"):
            await client.complete(REQUEST)
    assert len(calls) == 1
