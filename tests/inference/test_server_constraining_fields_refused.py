"""`ludic serve` refuses what it cannot honour rather than serving plain text: `guided_json: {}`
asks for "any JSON" (a real constraint, not the absent value), and `tool_choice` "required" or a
named function forces a tool call that vLLM would constrain decoding for. Only an empty
`logit_bias`, `bad_words` or `allowed_token_ids` is neutral; tool_choice "auto" and "none" are
served."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
NAMED = {"type": "function", "function": {"name": "f"}}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    with (
        EmbeddedEngine(model, tokenizer) as engine,
        TestClient(create_app(engine, model_name="tiny")) as test_client,
    ):
        yield test_client


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/chat/completions", "guided_json", {}),
        ("/v1/completions", "guided_json", {}),
        ("/v1/chat/completions", "structured_outputs", {}),
        ("/v1/chat/completions", "guided_choice", []),
    ],
)
def test_an_empty_constraint_is_refused_naming_it(
    client: TestClient, path: str, field: str, value: Any
) -> None:
    prompt: dict[str, Any] = {"messages": USER} if "chat" in path else {"prompt": [1, 2, 3]}
    reply = client.post(path, json={**prompt, "max_tokens": 2, field: value})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert f"{field}={value!r}" in message and "not supported" in message


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_a_forced_tool_call_is_refused_naming_it(
    client: TestClient, choice: Any, stream: bool
) -> None:
    body = {"messages": USER, "max_tokens": 2, "tools": TOOLS, "tool_choice": choice}
    reply = client.post("/v1/chat/completions", json={**body, "stream": stream})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert f"tool_choice={choice!r}" in message and "auto" in message and "none" in message


@pytest.mark.parametrize(
    "served",
    [
        {"tools": TOOLS, "tool_choice": "auto"},
        {"tools": TOOLS, "tool_choice": "none"},
        {"logit_bias": {}, "bad_words": [], "allowed_token_ids": []},
    ],
)
def test_tool_choice_auto_none_and_empty_token_lists_are_served(
    client: TestClient, served: dict[str, Any]
) -> None:
    reply = client.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2, **served})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 2
