"""Bodies `ludic serve` cannot read name the problem and the fix: JSON cut off or malformed,
bytes that are not UTF-8, JSON nested past the parser's limit, and a JSON body sent under
another Content-Type. Before: "invalid request: body.28: JSON decode error", "There was an
error parsing the body", and "body: Input should be a valid dictionary" (of a body that was
one). In process, through `ludic serve`'s app; a good request after each still succeeds."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

GOOD = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, TestClient(create_app(engine, model_name="tiny")) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (
            b'{"messages": [',
            "application/json",
            "the body is not valid JSON (Expecting value at character 14); send one JSON object",
        ),
        (
            b'{"messages": "\xff\xfe"}',
            "application/json",
            "the body is not UTF-8 (byte 0xff at position 14); send JSON encoded as UTF-8",
        ),
        (
            b"[" * 10_000 + b"]" * 10_000,  # past the recursion limit, under the count bound
            "application/json",
            "the body's JSON nests too deep to parse",
        ),
        (
            json.dumps(GOOD).encode(),
            "text/plain",
            "the body was sent as Content-Type 'text/plain', which this endpoint does not read: send it as JSON with Content-Type: application/json",
        ),
        (
            b"messages=hi",
            "application/x-www-form-urlencoded",
            "send it as JSON with Content-Type: application/json",
        ),
    ],
)
def test_an_unreadable_body_is_a_400_saying_what_and_the_fix(
    client: TestClient, body: bytes, content_type: str, message: str
) -> None:
    reply = client.post(
        "/v1/chat/completions", content=body, headers={"Content-Type": content_type}
    )
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json=GOOD).status_code == 200


def test_field_errors_keep_their_wording(client: TestClient) -> None:
    reply = client.post("/v1/chat/completions", json={**GOOD, "messages": "hi"})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"].startswith("invalid request: body.messages:")
