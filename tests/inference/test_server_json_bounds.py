"""`ludic serve` reads JSON bodies bounded and unambiguous (`ludic.inference.http.json_body`):
a body holding more values than any request within the context can use (four million token
ids just under the 8 MiB cap, or millions of empty lists) is a 413 before it is parsed (it was
parsed on the event loop, holding the GIL: ~1.5 s and ~6 s during which no other client got
an answer), and a key given twice in one object is a 400 naming it (Python's parser kept the
last one silently, where other parsers keep the first), and so is JSON nested past 100 levels
(900 parsed and failed in the chat template). A prompt at the context still parses;
a UTF-8 BOM is read as JSON allows. In process, through `ludic serve`'s app over the tiny
model; a good request after each bad one still succeeds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http import json_body
from ludic.inference.http.json_body import (
    MAX_JSON_DEPTH,
    MIN_JSON_VALUES,
    JSONBound,
    max_json_values,
    parse_bounded,
)
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model

GOOD = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CONTEXT = 2048  # the tiny model's


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    assert engine.max_model_len == CONTEXT
    with engine, TestClient(create_app(engine, model_name="tiny")) as client:
        yield client


def _post(client: TestClient, path: str, body: bytes) -> Any:
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", b'{"prompt":[' + b",".join([b"5"] * 4_000_000) + b'],"max_tokens":2}'),
        ("/v1/chat/completions", b'{"messages":[' + b",".join([b"[]"] * 2_700_000) + b"]}"),
    ],
    ids=["four-million-token-ids", "millions-of-empty-lists"],
)
def test_a_body_of_more_values_than_the_context_uses_is_refused_unparsed(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, path: str, body: bytes
) -> None:
    parsed: list[int] = []
    loads = json.loads

    def recorded(text: bytes, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return loads(text, **kwargs)

    monkeypatch.setattr(json_body.json, "loads", recorded)
    assert len(body) < 8 * 2**20  # under the byte cap: only the count refuses it
    reply = _post(client, path, body)
    assert reply.status_code == 413, reply.text[:300]
    message = reply.json()["error"]["message"]
    assert "commas and opening brackets" in message
    assert f"this server's {CONTEXT}-token context" in message
    assert f"at most {MIN_JSON_VALUES} are read" in message
    assert len(body) not in parsed  # refused before parsing
    assert client.post("/v1/chat/completions", json=GOOD).status_code == 200


def test_a_prompt_at_the_context_is_still_served(client: TestClient) -> None:
    ids = [5] * (CONTEXT - 1)
    reply = client.post("/v1/completions", json={"prompt": ids, "max_tokens": 1})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == CONTEXT - 1


def test_the_count_bound_is_exact_and_grows_with_the_context() -> None:
    limit = max_json_values(CONTEXT)
    assert limit == MIN_JSON_VALUES  # 8 per token of a 2048 context is fewer
    assert max_json_values(2**20) == 8 * 2**20
    bound = JSONBound.for_context(CONTEXT)
    at = b"[" + b",".join([b"1"] * limit) + b"]"  # limit - 1 commas and one bracket
    assert parse_bounded(at, bound) == [1] * limit
    over = b"[" + b",".join([b"1"] * (limit + 1)) + b"]"
    with pytest.raises(Exception, match=f"holds {limit + 1} commas") as caught:
        parse_bounded(over, bound)
    assert getattr(caught.value, "status_code", None) == 413


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "max_tokens": 300}',
            "max_tokens",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi", "role": "system"}], "max_tokens": 2}',
            "role",
        ),
        (b'{"messages": 5, "messages": [{"role": "user", "content": "hi"}]}', "messages"),
    ],
    ids=["top-level", "in-a-message", "a-field-of-another-type-first"],
)
def test_a_key_given_twice_is_a_400_naming_it(client: TestClient, body: bytes, key: str) -> None:
    reply = _post(client, "/v1/chat/completions", body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == (
        f"the body's JSON gives the key {key!r} twice in one object; send each key once"
    )
    assert client.post("/v1/chat/completions", json=GOOD).status_code == 200


def test_a_key_given_twice_to_the_token_guarded_probe_is_a_400_too() -> None:
    model, tokenizer = load_tiny_model()
    with (
        EmbeddedEngine(model, tokenizer) as engine,
        TestClient(create_app(engine, model_name="tiny", token="T")) as client,
    ):
        reply = client.post(
            "/ludic/logprobs",
            content=b'{"token_ids": [1, 2], "token_ids": [3, 4]}',
            headers={"Content-Type": "application/json", "Authorization": "Bearer T"},
        )
    assert reply.status_code == 400, reply.text
    assert "'token_ids' twice" in reply.json()["error"]["message"]


def test_a_utf8_bom_is_read_as_json_allows(client: TestClient) -> None:
    """RFC 8259 lets a parser ignore a BOM; it is served as the same request without one."""
    body = {**GOOD, "seed": 3, "temperature": 0.0}
    plain = _post(client, "/v1/chat/completions", json.dumps(body).encode())
    with_bom = _post(client, "/v1/chat/completions", b"\xef\xbb\xbf" + json.dumps(body).encode())
    assert plain.status_code == with_bom.status_code == 200, with_bom.text
    assert with_bom.json()["choices"] == plain.json()["choices"]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("body", "around"),  # around: the levels of lists and objects outside the nested one
    [
        ('{"messages": [{"role": "user", "content": "hi", "x": %s}], "max_tokens": 2}', 3),
        (
            '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": '
            '[{"type": "function", "function": {"name": "f", "parameters": {"x": %s}}}]}',
            5,
        ),
        ('{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": %s}}', 2),
    ],
    ids=["in-a-message", "in-a-tool-schema", "in-template-kwargs"],
)
def test_json_nested_past_the_depth_read_is_a_400_naming_it(
    client: TestClient, body: str, around: int
) -> None:
    """900 levels parse, but the chat template failed on them with 'maximum recursion depth
    exceeded in comparison', naming neither the nesting nor the fix."""
    for nested in (900, MAX_JSON_DEPTH - around + 1):
        reply = _post(client, "/v1/chat/completions", (body % _nested(nested)).encode())
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["message"] == (
            f"the body's JSON nests lists and objects {nested + around} levels deep, more than "
            f"the {MAX_JSON_DEPTH} this server reads; send a flatter JSON object"
        )
    at_limit = body % _nested(MAX_JSON_DEPTH - around)
    assert _post(client, "/v1/chat/completions", at_limit.encode()).status_code == 200


@pytest.mark.parametrize("path", ["/ludic/weights/init", "/ludic/weights/start"])
def test_a_weight_route_body_past_any_manifest_is_refused_before_the_token_check(
    path: str,
) -> None:
    """FastAPI parses a body before the route's bearer-token check: four million numbers from
    a client without the token were parsed (~1 s of the event loop) to answer 401."""
    model, tokenizer = load_tiny_model()
    tensors = len(model.state_dict())
    body = b'{"tensors":[' + b",".join([b"5"] * 4_000_000) + b"]}"
    with (
        EmbeddedEngine(model, tokenizer) as engine,
        TestClient(create_app(engine, model_name="tiny", token="T")) as client,
    ):
        reply = _post(client, path, body)
        assert reply.status_code == 413, reply.text[:300]
        message = reply.json()["error"]["message"]
        assert "more than a weight manifest of this model's" in message
        assert f"at most {MIN_JSON_VALUES + 16 * tensors} are read" in message
        unauthorized = _post(client, path, b'{"tensors": []}')
        assert unauthorized.status_code == 401, unauthorized.text
