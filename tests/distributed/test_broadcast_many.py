"""BroadcastPolicyPublisher with three embedded servers in one gloo group (in process, FastAPI
TestClient): one push reaches and is verified on each, a server that skips the load is named,
a server that goes away is reported and the others carry on, and it rejoins on the next push
at the current version."""

from __future__ import annotations

import copy
import gc
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import torch
from distributed_fakes import SPEC, TOKEN, nudge_
from fastapi.testclient import TestClient

from ludic.distributed import BroadcastPolicyPublisher, PublishVerificationError, WeightPushError
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


class DownableClient(TestClient):
    """A TestClient that can play a dead server: every request fails to connect."""

    down = False

    def request(self, method: str, url: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        if self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused (test: server down)")
        kwargs.pop("timeout", None)  # TestClient deprecates it; nothing here is slow
        return super().request(method, url, **kwargs)


@dataclass
class Server:
    url: str
    engine: EmbeddedEngine
    client: DownableClient
    app: Any
    sabotage: dict[str, bool]

    def kill(self) -> None:
        """The process is gone: its connections close, its receiver stops, nothing answers."""
        self.app.state.weight_receiver.close()
        gc.collect()  # its group is freed: its connections close, as a process exit does
        self.client.down = True

    def restart(self) -> None:
        """Back up as a fresh process would be: in no group, answering again."""
        self.client.down = False


@pytest.fixture
def servers() -> Iterator[tuple[torch.nn.Module, list[Server]]]:
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    made = []
    for i in range(3):
        engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
        sabotage = {"skip_load": False}
        _sabotage(engine, sabotage)
        app = create_app(engine, model_name="tiny", token=TOKEN)
        url = f"http://server{i}"
        client = DownableClient(app, base_url=url)
        client.__enter__()
        made.append(Server(url, engine, client, app, sabotage))
    yield model, made
    for server in made:
        server.client.down = False
        server.client.__exit__(None, None, None)
        server.engine.close()


def _sabotage(engine: EmbeddedEngine, sabotage: dict[str, bool]) -> None:
    """With `skip_load`, the engine receives the bytes, then keeps its old weights."""
    in_place = engine.update_weights_in_place
    assert in_place is not None

    def maybe_skip(fill: Any, *, version: int | None = None) -> int:
        old = {k: v.clone() for k, v in engine.model.state_dict().items()}

        def fill_then_undo(model: torch.nn.Module) -> None:
            fill(model)
            if sabotage["skip_load"]:
                model.load_state_dict(old)

        return in_place(fill_then_undo, version=version)

    engine.update_weights_in_place = maybe_skip  # type: ignore[method-assign]


def _publisher(servers: list[Server], **kwargs: Any) -> BroadcastPolicyPublisher:
    return BroadcastPolicyPublisher(
        [s.url for s in servers],
        TOKEN,
        http=[s.client for s in servers],
        timeout_s=20,
        **kwargs,
    )


def _serves(server: Server, model: torch.nn.Module) -> bool:
    served = server.engine.model.state_dict()
    return all(torch.equal(served[n], t) for n, t in model.state_dict().items())


@pytest.mark.parametrize("control", ["store", "http"])
def test_one_push_reaches_and_is_verified_on_every_server(
    servers: tuple[torch.nn.Module, list[Server]], control: str
) -> None:
    model, made = servers
    publisher = _publisher(made, control=control, probe_every=1)
    for version in (1, 2):
        nudge_(model, 0.01)
        publisher.publish(model, version=version)
        assert [s.engine.policy_version for s in made] == [version] * 3
        assert all(_serves(s, model) for s in made)
    assert publisher.last_push is not None
    assert publisher.last_push.servers == tuple(s.url for s in made)
    assert publisher.last_push.missed == {} and not publisher.last_push.retried
    ranks = [s.first_rank for s in publisher.servers]
    assert ranks == [1, 2, 3]  # one group: the trainer and every server
    publisher.close()


def test_a_server_that_skips_the_load_is_named(
    servers: tuple[torch.nn.Module, list[Server]],
) -> None:
    model, made = servers
    publisher = _publisher(made)
    publisher.publish(model, version=1)
    made[1].sabotage["skip_load"] = True
    nudge_(model, 0.01)
    with pytest.raises(PublishVerificationError, match=r"server http://server1: .*differ"):
        publisher.publish(model, version=2)


def test_a_dead_server_is_reported_the_rest_carry_on_and_it_rejoins_current(
    servers: tuple[torch.nn.Module, list[Server]], caplog: pytest.LogCaptureFixture
) -> None:
    model, made = servers
    publisher = _publisher(made)
    publisher.publish(model, version=1)
    made[2].kill()
    nudge_(model, 0.01)
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        publisher.publish(model, version=2)  # the push finds it gone, redoes it over two
    push = publisher.last_push
    assert push is not None and push.servers == ("http://server0", "http://server1")
    assert (
        list(push.missed) == ["http://server2"]
        and "Connection refused" in push.missed["http://server2"]
    )
    assert "did not reach http://server2" in caplog.text
    assert all(_serves(s, model) and s.engine.policy_version == 2 for s in made[:2])
    assert made[2].engine.policy_version == 1

    nudge_(model, 0.01)
    publisher.publish(model, version=3)  # still down: reported again, still fine
    assert publisher.last_push is not None and list(publisher.last_push.missed) == [
        "http://server2"
    ]
    made[2].restart()
    nudge_(model, 0.01)
    publisher.publish(model, version=4)  # re-initialised into the group at the current version
    assert publisher.last_push is not None and publisher.last_push.missed == {}
    assert len(publisher.last_push.servers) == 3
    assert all(_serves(s, model) and s.engine.policy_version == 4 for s in made)


def test_min_servers_makes_a_missing_server_fail_the_push(
    servers: tuple[torch.nn.Module, list[Server]],
) -> None:
    model, made = servers
    publisher = _publisher(made, min_servers=3)
    publisher.publish(model, version=1)
    made[0].kill()
    with pytest.raises(WeightPushError, match=r"2 of 3 servers .*http://server0: .*refused"):
        publisher.publish(model, version=2)
    assert [s.engine.policy_version for s in made[1:]] == [2, 2]  # the others still took it


def test_bad_server_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        BroadcastPolicyPublisher(["http://a", "http://a"], TOKEN)
    with pytest.raises(ValueError, match="min_servers"):
        BroadcastPolicyPublisher(["http://a", "http://b"], TOKEN, min_servers=3)
    with pytest.raises(ValueError, match="one server_ranks"):
        BroadcastPolicyPublisher(["http://a", "http://b"], TOKEN, server_ranks=[1])


def test_tensor_parallel_servers_take_consecutive_ranks_in_one_group() -> None:
    """Three servers of two ranks each (vLLM TP=2): ranks 1-2, 3-4, 5-6 of a 7-rank group."""
    inits: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ludic/weights/status":
            return httpx.Response(200, json={"controls": ["http"], "connected": False})
        if request.url.path == "/ludic/weights/init":
            inits.append({"url": str(request.url.host), **json.loads(request.content)})
            return httpx.Response(200, json={"status": "joining"})  # and never joins
        return httpx.Response(404)

    urls = [f"http://tp{i}" for i in range(3)]
    clients = [httpx.Client(base_url=u, transport=httpx.MockTransport(handler)) for u in urls]
    publisher = BroadcastPolicyPublisher(
        urls, TOKEN, http=clients, server_ranks=2, timeout_s=1, control="http"
    )
    with pytest.raises(WeightPushError, match="did not all join"):
        publisher.connect()
    assert [(i["url"], i.get("rank", 1), i["world_size"]) for i in inits] == [
        ("tp0", 1, 7),
        ("tp1", 3, 7),
        ("tp2", 5, 7),
    ]
