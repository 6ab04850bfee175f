"""The vLLM extension's `/ludic/weights/init` refuses a bad body with a 400 naming the field
(or saying the body is not a JSON object), never a 500 traceback. The real middleware and
routes over a fake engine client (as `test_vllm_routes_tenure`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ludic.inference.http.weight_tenure import Tenure
from ludic.inference.vllm import routes as vllm_routes
from ludic.inference.vllm import server as vllm_server

TOKEN = "vllm-init-body"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class GrouplessEngine:
    """`collective_rpc` records the calls; the workers' join does nothing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(method)
        return [None]


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv(vllm_server.TOKEN_ENV, TOKEN)
    monkeypatch.setattr(vllm_routes, "_tenure", Tenure())
    vllm_routes._push.clear()
    app = FastAPI()
    app.middleware("http")(vllm_server.ludic_middleware)
    app.state.engine_client = GrouplessEngine()
    with TestClient(app, base_url="http://testserver", raise_server_exceptions=False) as c:
        yield c
    vllm_routes._push.clear()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"port": 1234}, "host: Field required"),
        ({"host": "127.0.0.1", "port": "x"}, "port: Input should be a valid integer"),
        ({"host": "127.0.0.1", "port": 1234, "trainer": 5}, "trainer: Input should be"),
        ([1, 2], "must be a JSON object (host, port, ...), got list"),
        ("127.0.0.1", "must be a JSON object (host, port, ...), got str"),
    ],
)
def test_a_bad_init_body_is_a_400_naming_the_field(
    client: TestClient, body: Any, named: str
) -> None:
    reply = client.post("/ludic/weights/init", headers=AUTH, json=body)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert named in message, message
    assert "ludic_weights_init" not in client.app.state.engine_client.calls  # type: ignore[attr-defined]


def test_an_unknown_init_field_is_ignored_as_on_the_embedded_server(client: TestClient) -> None:
    body = {"host": "127.0.0.1", "port": 1234, "from_a_newer_trainer": True}
    reply = client.post("/ludic/weights/init", headers=AUTH, json=body)
    assert reply.status_code == 200, reply.text
