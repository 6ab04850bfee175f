"""A `/ludic/weights/finish` or `/close` body that is not a JSON object (`[]`, `"x"`, `null`,
`5`), or whose "group" is not a string, is a 400 that leaves the held group as it was, on both
servers: read as "no group" (an older trainer's empty body), it closed the group held. An
empty body still closes it, and `{"group": ...}` closes that group. The embedded server's app
in process (its join aimed at a port where no trainer listens: the group is held, joining), and
the vLLM extension's real middleware and routes over a fake engine client."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ludic.distributed.manifest import plan_manifest
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.inference.http.weight_tenure import Tenure
from ludic.inference.vllm import routes as vllm_routes
from ludic.inference.vllm import server as vllm_server
from ludic.models import load_tiny_model

TOKEN = "route-bodies"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
NOT_OBJECTS = [b"[]", b'"x"', b"null", b"5", b'{"group": [1]}', b'{"group": 7}', b"{", b"\xff"]


class GrouplessEngine:
    """`collective_rpc` records the calls; the workers' join and close do nothing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(method)
        return [None]


@pytest.fixture(scope="module")
def embedded() -> Iterator[TestClient]:
    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(model, tokenizer)
    with engine, TestClient(create_app(engine, model_name="tiny", token=TOKEN)) as client:
        yield client


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv(vllm_server.TOKEN_ENV, TOKEN)
    monkeypatch.setattr(vllm_routes, "_tenure", Tenure())
    vllm_routes._push.clear()
    app = FastAPI()
    app.middleware("http")(vllm_server.ludic_middleware)
    app.state.engine_client = GrouplessEngine()
    with TestClient(app, base_url="http://testserver") as client:
        yield client
    vllm_routes._push.clear()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _join(client: TestClient) -> str:
    body = {
        "host": "127.0.0.1",
        "port": _closed_port(),
        "timeout_s": 1,
        "trainer": {"id": "bodies", "host": "here"},
    }
    reply = client.post("/ludic/weights/init", headers=AUTH, json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["group"])


def _held(client: TestClient) -> str | None:
    return client.get("/ludic/weights/status", headers=AUTH).json().get("group")


@pytest.mark.parametrize("route", ["/ludic/weights/close", "/ludic/weights/finish"])
@pytest.mark.parametrize("body", NOT_OBJECTS)
@pytest.mark.parametrize("server", ["embedded", "vllm"])
def test_a_body_that_is_not_an_object_is_a_400_and_keeps_the_group(
    request: pytest.FixtureRequest, server: str, route: str, body: bytes
) -> None:
    client: TestClient = request.getfixturevalue(server)
    group = _join(client)
    try:
        reply = client.post(route, headers=AUTH, content=body)
        assert reply.status_code == 400, reply.text
        message = reply.json()["error"]["message"]
        said = ('{"group": "<id from /ludic/weights/init>"}', '"group" must be the group id')
        assert route in message and any(words in message for words in said), message
        assert _held(client) == group
        if server == "vllm":
            assert "ludic_weights_close" not in client.app.state.engine_client.calls  # type: ignore[attr-defined]
    finally:
        assert client.post("/ludic/weights/close", headers=AUTH, json={"group": group}).is_success
    assert _held(client) is None


@pytest.mark.parametrize("server", ["embedded", "vllm"])
def test_an_empty_close_still_closes_the_group_held(
    request: pytest.FixtureRequest, server: str
) -> None:
    client: TestClient = request.getfixturevalue(server)
    _join(client)
    reply = client.post("/ludic/weights/close", headers={"Authorization": AUTH["Authorization"]})
    assert reply.status_code == 200, reply.text
    assert _held(client) is None


@pytest.mark.parametrize("server", ["embedded", "vllm"])
def test_a_start_naming_a_group_that_is_not_a_string_is_a_400(
    request: pytest.FixtureRequest, server: str
) -> None:
    client: TestClient = request.getfixturevalue(server)
    group = _join(client)
    try:
        manifest = plan_manifest({"w": torch.zeros(4)}, version=1, bucket_bytes=64).to_json()
        reply = client.post(
            "/ludic/weights/start", headers=AUTH, json={**manifest, "group": [group]}
        )
        assert reply.status_code == 400, reply.text
        assert '"group" must be the group id string' in reply.json()["error"]["message"]
        assert _held(client) == group
    finally:
        client.post("/ludic/weights/close", headers=AUTH, json={"group": group})
