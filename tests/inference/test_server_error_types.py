"""The server's error bodies name the `openai` SDK's exception for their status, as vLLM's
OpenAI server does: a wrong or missing control token is an AuthenticationError, not a
BadRequestError. A status the SDK has no exception of its own for is named after its HTTP
reason: a 413 (body too large) said "BadRequestError", which sent its reader looking for a bad
field, and so did a 405, 408, 409, 422 and 499."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.openai_protocol import error_body
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model


def test_auth_failures_have_their_openai_types() -> None:
    assert error_body(401, "wrong token")["error"]["type"] == "AuthenticationError"
    assert error_body(403, "disabled")["error"]["type"] == "PermissionDeniedError"


def test_other_statuses_keep_their_types() -> None:
    assert error_body(400, "bad")["error"] == {
        "message": "bad",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    assert error_body(404, "no such model")["error"]["type"] == "NotFoundError"
    assert error_body(503, "closed")["error"]["type"] == "InternalServerError"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 429, 500, 503])
def test_each_status_the_sdk_names_has_the_sdks_name(status: int) -> None:
    sdk = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")
    reply = httpx.Response(status, request=httpx.Request("POST", "http://127.0.0.1:9"))
    raised = sdk._make_status_error("m", body=None, response=reply)
    assert error_body(status, "m")["error"]["type"] == type(raised).__name__


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (405, "MethodNotAllowedError"),
        (408, "RequestTimeoutError"),
        (413, "PayloadTooLargeError"),
        (499, "ClientClosedRequestError"),
        (418, "APIStatusError"),  # the SDK's exception for a status it has no class for
    ],
)
def test_statuses_the_sdk_does_not_name_are_not_bad_requests(status: int, kind: str) -> None:
    assert error_body(status, "m")["error"]["type"] == kind


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, TestClient(create_app(engine, model_name="tiny", max_body_bytes=200)) as client:
        yield client


def test_a_body_too_large_is_a_payload_too_large_error(client: TestClient) -> None:
    padded = {"messages": [{"role": "user", "content": "x" * 300}], "max_tokens": 2}
    sized = client.post("/v1/chat/completions", json=padded)
    unsized = client.post(  # chunked: refused as it arrives, through the app's error handler
        "/v1/chat/completions",
        content=iter([b'{"messages": [{"role": "user", "content": "', b"x" * 300, b'"}]}']),
    )
    for reply in (sized, unsized):
        assert reply.status_code == 413, reply.text
        assert reply.json()["error"]["type"] == "PayloadTooLargeError"


def test_a_wrong_method_is_a_method_not_allowed_error(client: TestClient) -> None:
    reply = client.get("/v1/chat/completions")
    assert reply.status_code == 405
    assert reply.json()["error"]["type"] == "MethodNotAllowedError"
