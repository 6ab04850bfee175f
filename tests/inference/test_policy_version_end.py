"""A reply whose tokens span a weight push says so: `policy_version` is the version its first
token was sampled under, `extra["policy_version_end"]` its last token's, in process and over
HTTP alike (`ludic serve` sends `policy_version_end` beside `policy_version`; the HTTP client
reads it back into `extra`). Before, HTTP replies carried the starting version only, so a
client could not see that a completion mixed two policies. A non-streamed reply's
`X-Ludic-Policy-Version` header is its body's `policy_version` (it was the engine's version as
the reply was sent), and `ChatResponse.to_info()` puts `policy_version_end` in step info."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from tests.inference.test_server import serving_in_thread

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.embedded.sequence import SequenceState
from ludic.inference.http.openai_client import (
    VERSION_HEADER,
    InferenceResponseError,
    OpenAICompatibleClient,
)
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

USER = [{"role": "user", "content": "Your move."}]
SAMPLING = SamplingConfig(max_tokens=6, seed=3, extras={"ignore_eos": True})
PUSH_AT_TOKEN = 2


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedEngine]:
    """An engine at version 0 that queues a push to version 1 once a request has sampled
    `PUSH_AT_TOKEN` tokens: the worker applies it before its next decode step, so that request
    finishes under version 1 whatever the machine's speed."""
    model, tokenizer = load_tiny_model()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    append, pushes = SequenceState.append, []

    with EmbeddedEngine(model, tokenizer) as served:

        def push_mid_reply(seq: SequenceState, *args: Any, **kwargs: Any) -> None:
            append(seq, *args, **kwargs)
            if len(seq.completion_ids) == PUSH_AT_TOKEN and not pushes:
                push = threading.Thread(target=served.update_weights, args=(weights,))
                pushes.append(push)
                push.start()
                deadline = time.monotonic() + 60  # a guard against hanging, not a speed check
                while not served._controls:
                    assert push.is_alive() and time.monotonic() < deadline
                    time.sleep(0.001)

        monkeypatch.setattr(SequenceState, "append", push_mid_reply)
        yield served
        monkeypatch.undo()
        for push in pushes:
            push.join(60)


async def _in_process(engine: EmbeddedEngine, request: ChatRequest) -> Any:
    return await engine.complete(request)


async def _over_http(engine: EmbeddedEngine, request: ChatRequest) -> Any:
    with serving_in_thread(create_app(engine, model_name="tiny")) as url:
        async with OpenAICompatibleClient(url, "tiny", timeout=120) as client:
            return await client.complete(request)


@pytest.mark.parametrize("complete", [_in_process, _over_http], ids=["in-process", "http"])
@pytest.mark.parametrize("token_in", [False, True], ids=["chat", "token-in"])
async def test_a_reply_spanning_a_push_reports_both_versions(
    engine: EmbeddedEngine,
    complete: Callable[[EmbeddedEngine, ChatRequest], Any],
    token_in: bool,
) -> None:
    prompt = [5, 6, 7] if token_in else None
    request = ChatRequest(messages=USER, sampling=SAMPLING, prompt_token_ids=prompt)
    r = await complete(engine, request)
    assert len(r.completion_token_ids) == SAMPLING.max_tokens
    assert r.policy_version == 0 and r.extra["policy_version_end"] == 1
    assert engine.policy_version == 1


def test_the_server_sends_both_versions_unstreamed_and_streamed(engine: EmbeddedEngine) -> None:
    body = {"messages": USER, "max_tokens": 6, "ignore_eos": True, "seed": 3}
    with serving_in_thread(create_app(engine, model_name="tiny")) as url:
        spanning = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        after = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        with httpx.stream(
            "POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120
        ) as reply:
            events = [line.removeprefix("data: ") for line in reply.iter_lines() if line]
    assert (spanning["policy_version"], spanning["policy_version_end"]) == (0, 1)
    assert (after["policy_version"], after["policy_version_end"]) == (1, 1)
    last = json.loads(events[-2])  # before [DONE]
    assert (last["policy_version"], last["policy_version_end"]) == (1, 1)


def test_an_unstreamed_reply_s_header_is_its_body_s_version(engine: EmbeddedEngine) -> None:
    """The header was the engine's version as the reply was sent: 1 for a reply whose first
    token was sampled under 0, so a client reading the header saw a newer policy than the body's
    (and than the tokens'); it is now the body's `policy_version`."""
    body = {"messages": USER, "max_tokens": 6, "ignore_eos": True, "seed": 3}
    with serving_in_thread(create_app(engine, model_name="tiny")) as url:
        spanning = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        after = httpx.post(url + "/v1/completions", json={**body, "prompt": [5]}, timeout=120)
    assert (spanning.json()["policy_version"], spanning.headers[VERSION_HEADER]) == (0, "0")
    assert (after.json()["policy_version"], after.headers[VERSION_HEADER]) == (1, "1")
    assert [k.lower() for k in spanning.headers].count(VERSION_HEADER.lower()) == 1


async def test_step_info_carries_the_end_version_of_a_reply_spanning_a_push(
    engine: EmbeddedEngine,
) -> None:
    spanning = await engine.complete(ChatRequest(messages=USER, sampling=SAMPLING))
    after = await engine.complete(ChatRequest(messages=USER, sampling=SAMPLING))
    assert spanning.to_info()["policy_version"] == 0
    assert spanning.to_info()["policy_version_end"] == 1
    assert after.to_info()["policy_version"] == 1
    assert "policy_version_end" not in after.to_info()  # only where the versions differ


def _reply(**versions: Any) -> dict[str, Any]:
    choice = {"message": {"content": "hi"}, "finish_reason": "stop", "token_ids": [7, 8]}
    return {"choices": [choice], "prompt_token_ids": [1, 2, 3], **versions}


async def _parsed(body: dict[str, Any]) -> Any:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    transport = httpx.MockTransport(handler)
    async with OpenAICompatibleClient("http://test", "m", transport=transport) as client:
        return await client.complete(ChatRequest(messages=USER))


@pytest.mark.parametrize(
    ("versions", "extra"),
    [
        ({"policy_version": 4, "policy_version_end": 5}, {"policy_version_end": 5}),
        ({"policy_version": 4, "policy_version_end": 4}, {}),  # no push mid-reply
        ({"policy_version": 4}, {}),  # a server that does not send it (vLLM)
    ],
)
async def test_the_client_reads_the_end_version_where_the_engine_puts_it(
    versions: dict[str, int], extra: dict[str, int]
) -> None:
    r = await _parsed(_reply(**versions))
    assert r.policy_version == 4 and r.extra == extra


async def test_an_end_version_that_is_no_int_is_named() -> None:
    with pytest.raises(InferenceResponseError, match="its policy version end is 'v5', not an int"):
        await _parsed(_reply(policy_version=4, policy_version_end="v5"))
