"""A request field sent as null takes its default, as OpenAI's API types them (`stream:
boolean | null`, `logprobs: boolean | null`, `n: integer | null`, ...) and vLLM reads them:
clients that write every field (None serialized as null) got a 400 "Input should be a valid
boolean" for `"logprobs": null` or `"stream": null`. A wrong non-null type is still a 400."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

NULLS = {
    "stream": None,
    "n": None,
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "ignore_eos": None,
    "return_token_ids": None,
    "max_tokens": None,
    "max_completion_tokens": 2,
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, TestClient(create_app(engine, model_name="tiny")) as client:
        yield client


def test_nulls_in_a_chat_request_are_its_defaults(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **NULLS}
    reply = client.post("/v1/chat/completions", json={**body, "logprobs": None})
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["logprobs"] is None and reply.json()["usage"]["completion_tokens"] <= 2


def test_nulls_in_a_text_completion_are_its_defaults(client: TestClient) -> None:
    reply = client.post("/v1/completions", json={"prompt": "hi", "logprobs": None, **NULLS})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["logprobs"] is None


def test_a_wrong_type_that_is_not_null_is_still_refused(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for field, value in (("stream", "yes"), ("logprobs", 1), ("n", "2")):
        reply = client.post("/v1/chat/completions", json={**body, field: value})
        assert reply.status_code == 400, (field, reply.text)
        assert f"body.{field}" in reply.json()["error"]["message"]
