"""Every reply of the embedded server carries the policy version it served at, in the
`X-Ludic-Policy-Version` header the client reads (completions, refusals, health, streams), and
the header follows weight updates."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.openai_client import VERSION_HEADER
from ludic.inference.http.server import create_app
from ludic.models import load_tiny_model


def test_each_reply_names_the_policy_version_it_was_served_at() -> None:
    model, tokenizer = load_tiny_model()
    with EmbeddedEngine(model, tokenizer) as engine:
        app = create_app(engine, model_name="tiny", max_body_bytes=1000)
        with TestClient(app) as client:
            body = {"prompt": [5, 6, 7], "max_tokens": 2}
            assert client.post("/v1/completions", json=body).headers[VERSION_HEADER] == "0"
            engine.update_weights(model, version=7)
            replies = [
                client.post("/v1/completions", json=body),
                client.post("/v1/completions", json={**body, "stream": True}),
                client.post("/v1/completions", json={**body, "pad": "x" * 1000}),  # 413
                client.post("/v1/completions", json={"prompt": [5], "max_tokens": -1}),  # 400
                client.get("/health"),
            ]
    assert [r.status_code for r in replies] == [200, 200, 413, 400, 200]
    assert [r.headers.get(VERSION_HEADER) for r in replies] == ["7"] * 5
    assert [k.lower() for k in replies[0].headers].count(VERSION_HEADER.lower()) == 1
