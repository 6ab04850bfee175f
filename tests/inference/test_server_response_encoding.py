"""A non-streamed completion is sent as `JSONResponse(body)`: the bytes and headers FastAPI
sent for the returned dict (compact JSON, `application/json`, the policy version header),
without FastAPI's `jsonable_encoder` walk over every logprob (~2 ms of CPU per 64-token reply,
on the server's one event loop)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.openai_client import VERSION_HEADER
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

CHAT = {
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 16,
    "logprobs": True,
    "return_token_ids": True,
    "seed": 3,
}
TEXT = {"prompt": [5, 6, 7], "max_tokens": 16, "logprobs": 1, "return_token_ids": True, "seed": 3}


def test_a_completion_with_logprobs_is_sent_as_fastapi_sent_its_dict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded: list[Any] = []

    def recording_encoder(content: Any, *args: Any, **kwargs: Any) -> Any:
        encoded.append(content)
        return content

    monkeypatch.setattr("fastapi.routing.jsonable_encoder", recording_encoder)
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as engine:
        app = create_app(engine, model_name="tiny")
        with TestClient(app) as client:
            replies = [
                client.post("/v1/chat/completions", json=CHAT),
                client.post("/v1/completions", json=TEXT),
            ]
    for reply in replies:
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert len(body["choices"][0]["token_ids"]) > 0
        # Starlette's JSONResponse rendering, which FastAPI applied to the returned dict
        rendered = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        assert reply.content == rendered.encode("utf-8")
        assert dict(reply.headers) == {
            "content-length": str(len(reply.content)),
            "content-type": "application/json",
            VERSION_HEADER.lower(): "0",
        }
    assert replies[0].json()["choices"][0]["logprobs"]["content"]
    assert replies[1].json()["choices"][0]["logprobs"]["token_logprobs"]
    assert encoded == [], "the completion bodies went through jsonable_encoder"
