"""`ludic serve` refuses (400, naming the field) an OpenAI/vLLM sampling field it does not
implement when the request sets it to anything but its neutral value: a `presence_penalty`,
`logit_bias`, `min_tokens`, `best_of` or `echo` served as if absent would sample from another
distribution than the one asked for, silently. The embedded engine refuses the same knobs in
process (as `SamplingConfig.extras`), so a request sent through `OpenAICompatibleClient` is now
refused over HTTP as it is in process. Neutral values and unrelated unknown fields still pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.openai_client import InferenceRequestError, OpenAICompatibleClient
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as eng:
        yield eng


@pytest.fixture(scope="module")
def app(engine: EmbeddedEngine) -> FastAPI:
    return create_app(engine, model_name="tiny")


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "presence_penalty", 1.5),
        ("/v1/chat/completions", "frequency_penalty", 0.5),
        ("/v1/chat/completions", "repetition_penalty", 1.3),
        ("/v1/chat/completions", "logit_bias", {"5": 100}),
        ("/v1/chat/completions", "min_tokens", 3),
        ("/v1/chat/completions", "min_p", 0.1),
        ("/v1/chat/completions", "response_format", {"type": "json_object"}),
        ("/v1/completions", "best_of", 3),
        ("/v1/completions", "echo", True),
        ("/v1/completions", "presence_penalty", 1.0),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_sampling_field_the_server_does_not_implement_is_a_400_naming_it(
    client: TestClient, path: str, field: str, value: Any, stream: bool
) -> None:
    prompt: dict[str, Any] = {"messages": USER} if "chat" in path else {"prompt": [1, 2, 3]}
    body = {**prompt, "max_tokens": 2, field: value, **({"stream": True} if stream else {})}
    reply = client.post(path, json=body)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert f"{field}={value!r}" in message and "not supported" in message


@pytest.mark.parametrize(
    "neutral",
    [
        {"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1.0},
        {"logit_bias": {}, "min_tokens": 0, "min_p": 0, "best_of": 1, "echo": False},
        {"response_format": {"type": "text"}, "logit_bias": None},
        {"user": "someone", "vllm_xargs": {"max_think": 4}},  # unrelated: ignored as before
    ],
)
def test_neutral_values_and_unrelated_fields_are_served(
    client: TestClient, neutral: dict[str, Any]
) -> None:
    reply = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, **neutral})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 2


async def test_the_client_gets_the_refusal_the_engine_gives_in_process(
    engine: EmbeddedEngine, app: FastAPI
) -> None:
    request = ChatRequest(
        messages=USER, sampling=SamplingConfig(max_tokens=2, extras={"presence_penalty": 1.0})
    )
    with pytest.raises(ValueError, match="presence_penalty"):
        await engine.complete(request)  # in process
    http = OpenAICompatibleClient(
        "http://testserver", model="tiny", max_retries=0, transport=httpx.ASGITransport(app)
    )
    async with http:
        with pytest.raises(InferenceRequestError, match=r"presence_penalty=1\.0") as info:
            await http.complete(request)  # over HTTP, the same request
    assert info.value.status_code == 400
