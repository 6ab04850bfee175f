"""The server's error bodies name the `openai` SDK's exception for their status, as vLLM's
OpenAI server does: a wrong or missing control token is an AuthenticationError, not a
BadRequestError."""

from __future__ import annotations

from ludic.inference.http.openai_protocol import error_body


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
