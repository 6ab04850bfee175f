"""The vLLM extension's routes tell trainers apart as the embedded server does: a second
trainer's `/init` replaces the first one's group (one log line naming both), and the first
trainer's `/start`, `/finish` and `/close` are refused (409 naming the one that joined),
freeing nothing. The real middleware and routes over a fake engine client whose workers
join no group (what is tested here is the routes' bookkeeping, not the transfer)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ludic.distributed.manifest import plan_manifest
from ludic.inference.http.weight_tenure import Tenure
from ludic.inference.vllm import routes as vllm_routes
from ludic.inference.vllm import server as vllm_server

TOKEN = "vllm-tenure"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REPLACED = "replaced by another trainer"


class GrouplessEngine:
    """`collective_rpc` records the calls; the workers' join and close do nothing."""

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
    with TestClient(app, base_url="http://testserver") as test_client:
        yield test_client
    vllm_routes._push.clear()


def _init(client: TestClient, port: int, trainer: str) -> str:
    body = {
        "host": "127.0.0.1",
        "port": port,
        "trainer": {"id": trainer, "host": f"host-{trainer}", "pid": port},
    }
    reply = client.post("/ludic/weights/init", headers=AUTH, json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["group"])


def test_a_replaced_trainer_is_refused_and_frees_nothing(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ludic.inference.vllm.routes"):
        first = _init(client, 1111, "first")
        second = _init(client, 2222, "second")
    lines = [r.getMessage() for r in caplog.records if "joined and replaced" in r.getMessage()]
    assert len(lines) == 1 and "host-second" in lines[0] and "host-first" in lines[0], lines

    closed = client.post("/ludic/weights/close", headers=AUTH, json={"group": first})
    assert closed.status_code == 409 and REPLACED in closed.text and "host-second" in closed.text
    status = client.get(f"/ludic/weights/status?group={first}", headers=AUTH).json()
    assert status["group"] == second and REPLACED in status["replaced_by"]
    assert "ludic_weights_close" not in client.app.state.engine_client.calls  # type: ignore[attr-defined]

    manifest = plan_manifest({"w": torch.zeros(4)}, version=1, bucket_bytes=64).to_json()
    start = client.post("/ludic/weights/start", headers=AUTH, json={**manifest, "group": first})
    assert start.status_code == 409 and REPLACED in start.text
    finish = client.post("/ludic/weights/finish", headers=AUTH, json={"group": first})
    assert finish.status_code == 409 and REPLACED in finish.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ludic.inference.vllm.routes"):
        again = _init(client, 3333, "second")  # the same trainer rejoins: no one replaced
    assert not [r for r in caplog.records if "joined and replaced" in r.getMessage()]
    stale = client.post("/ludic/weights/close", headers=AUTH, json={"group": second})
    assert stale.status_code == 409 and REPLACED not in stale.text  # its own older group
    assert client.post("/ludic/weights/close", headers=AUTH, json={"group": again}).is_success
    status = client.get("/ludic/weights/status", headers=AUTH).json()
    assert "group" not in status and not status["connected"]
    late = client.post("/ludic/weights/close", headers=AUTH, json={"group": again})
    assert late.is_success  # nothing held: a repeated close frees nothing, refuses nothing
