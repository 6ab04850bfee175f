"""Weight updates that must not be served: a nan or inf tensor is refused with a 4xx naming
it before it replaces the served weights (HTTP upload, broadcast receiver, in process), a
negative or non-integer version is a 400, a nan logprob is never sent as JSON (an error
instead), and a join to a trainer that never answers gives up at its `timeout_s` and never
keeps `ludic serve` from stopping on SIGTERM or SIGINT."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from safetensors.torch import save
from test_server import AUTH, TOKEN, USER, Server, free_port, start_server

from ludic.distributed import BroadcastPolicyPublisher, InProcessPublisher
from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import BufferPool, host_store, open_group, send_buckets
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.auth import TOKEN_ENV
from ludic.inference.http.weight_routes import install_weight_sync_routes
from ludic.inference.weights import NonFiniteWeightsError
from ludic.models import load_tiny_model, tiny_model_dir

pytestmark = pytest.mark.timeout(240)
NORM = "model.norm.weight"
PROBE = {"token_ids": [1, 5, 9, 13, 17, 21]}


def _payload(state: Mapping[str, torch.Tensor]) -> bytes:
    return io.BytesIO(save({k: v.contiguous() for k, v in state.items()})).getvalue()


def _nan_norm(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's full state with a nan in the final norm (a diverged trainer's)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state[NORM][3] = float("nan")
    return state


# ---- in process: EmbeddedEngine.update_weights and the in-process publisher ----------------


def test_engine_refuses_nan_and_a_bad_version_before_any_write() -> None:
    model, tokenizer = load_tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with EmbeddedEngine(model, tokenizer) as engine:
        state = {"model.embed_tokens.weight": torch.zeros_like(before["model.embed_tokens.weight"])}
        state[NORM] = torch.full_like(before[NORM], float("inf"))
        with pytest.raises(NonFiniteWeightsError, match=NORM) as caught:
            engine.update_weights(state, strict=False)
        assert caught.value.names == [NORM]  # the finite one is not blamed
        for bad in (-5, True, 1.5):
            with pytest.raises(ValueError, match="version must be an int >= 0"):
                engine.update_weights({}, version=bad, strict=False)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="version must be an int >= 0"):
            engine.update_weights_in_place(lambda _m: None, version=-1)
        assert engine.policy_version == 0
        # Nothing was written, not even the finite tensor sent beside the bad one.
        assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
        publisher = InProcessPublisher(engine)
        with pytest.raises(NonFiniteWeightsError, match=NORM):
            publisher.publish(_nan_norm(model), version=1)
        assert engine.policy_version == 0
        assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


# ---- the broadcast receiver on a bare app: buffered load, in-place load, the join ----------


class _Engine:
    """Loads with `load_state_dict` (checks nothing itself); `in_place` adds
    `update_weights_in_place`, as the embedded engine has."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        self.loads: list[int | None] = []

    def update_weights(
        self, state: Mapping[str, torch.Tensor], *, version: int | None = None, strict: bool = True
    ) -> int:
        self.model.load_state_dict(dict(state), strict=strict)
        self.loads.append(version)
        return -1 if version is None else version


class _InPlaceEngine(_Engine):
    def update_weights_in_place(self, fill: Any, *, version: int | None = None) -> int:
        with torch.no_grad():
            fill(self.model)
        self.loads.append(version)
        return -1 if version is None else version


def _push_twice(engine: _Engine) -> tuple[Any, Any, dict[str, Any]]:
    """Push a state with a nan in `0.bias` then a finite one over the same group; the two
    /finish replies and the status between them."""
    client = TestClient(_app(engine))
    store = host_store("127.0.0.1", 0, world_size=2, timeout_s=30)
    body = {"host": "127.0.0.1", "port": store.port, "timeout_s": 30}
    assert client.post("/ludic/weights/init", headers=AUTH, json=body).is_success
    group = open_group(store, rank=0, world_size=2, backend="gloo", timeout_s=30)
    replies = []
    status: dict[str, Any] = {}
    for version, poisoned in ((1, True), (2, False)):
        new = {k: torch.randn_like(v) for k, v in engine.model.state_dict().items()}
        if poisoned:
            new["0.bias"][1] = float("nan")
        manifest = plan_manifest(new, version=version, bucket_bytes=32)
        assert client.post("/ludic/weights/start", headers=AUTH, json=manifest.to_json()).is_success
        send_buckets(group, manifest, new, pool=BufferPool("cpu"))
        replies.append(client.post("/ludic/weights/finish", headers=AUTH))
        if poisoned:
            status = client.get("/ludic/weights/status", headers=AUTH).json()
    return replies[0], replies[1], status


def _app(engine: Any) -> FastAPI:
    app = FastAPI()
    install_weight_sync_routes(app, engine, TOKEN)
    return app


def test_a_buffered_push_with_nan_is_refused_before_loading_and_the_group_stays() -> None:
    engine = _Engine()
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    refused, finite, status = _push_twice(engine)
    assert refused.status_code == 422
    assert "0.bias" in refused.text and "nan or inf" in refused.text
    assert "the served model is as it was" in refused.text
    assert status["connected"] and "0.bias" in status["last_error"]
    # The refused push never reached the engine: its model is as it was until the next push.
    assert engine.loads == [2] and finite.json()["policy_version"] == 2
    assert not any(torch.equal(engine.model.state_dict()[k], v) for k, v in before.items())


def test_an_in_place_push_with_nan_is_refused_before_its_version_is_served() -> None:
    engine = _InPlaceEngine()
    refused, finite, status = _push_twice(engine)
    assert refused.status_code == 422 and "0.bias" in refused.text
    assert "received in place" in refused.text  # the reply says what the model holds
    assert status["connected"] and "0.bias" in status["last_error"]
    assert engine.loads == [2] and finite.json()["policy_version"] == 2  # the group still works
    assert all(bool(torch.isfinite(p).all()) for p in engine.model.parameters())


@pytest.fixture
def silent_trainer() -> Iterator[int]:
    """A port that accepts TCP connections and never answers (a trainer's store that hangs:
    c10d's own connect timeout never fires on it)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        yield int(listener.getsockname()[1])


def test_a_join_that_never_completes_gives_up_at_its_timeout(silent_trainer: int) -> None:
    client = TestClient(_app(_Engine()))
    body = {"host": "127.0.0.1", "port": silent_trainer, "timeout_s": 2}
    started = time.monotonic()
    assert client.post("/ludic/weights/init", headers=AUTH, json=body).is_success
    assert client.get("/ludic/weights/status", headers=AUTH).json()["joining"]
    status = _status_once_joined(client, within_s=60)
    assert time.monotonic() - started < 30
    assert not status["joining"] and not status["connected"]
    assert "timeout_s=2 s" in status["join_error"]
    assert f"127.0.0.1:{silent_trainer}" in status["last_error"]
    assert "POST /ludic/weights/init again" in status["last_error"]
    manifest = plan_manifest(_Engine().model.state_dict(), version=1, bucket_bytes=32).to_json()
    reply = client.post("/ludic/weights/start", headers=AUTH, json=manifest)
    assert reply.status_code == 409 and "could not join" in reply.text


def _status_once_joined(client: TestClient, *, within_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        status: dict[str, Any] = client.get("/ludic/weights/status", headers=AUTH).json()
        if not status["joining"]:
            return status
        time.sleep(0.1)
    raise AssertionError(f"still joining after {within_s} s")


# ---- `ludic serve` in a subprocess --------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_model_dir(), tmp_path_factory.mktemp("guards") / "server.log")
    yield srv
    srv.stop()


def _probe(srv: Server) -> list[float]:
    reply = httpx.post(srv.url + "/ludic/logprobs", json=PROBE, headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    values: list[float] = reply.json()["logprobs"]
    return values


def _version(srv: Server) -> int:
    return int(httpx.get(srv.url + "/ludic/version", headers=AUTH).json()["policy_version"])


def _chat(srv: Server, **extra: Any) -> httpx.Response:
    body = {"messages": USER, "max_tokens": 4, "logprobs": True, **extra}
    return httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)


def _completion(srv: Server, **extra: Any) -> httpx.Response:
    body = {"prompt": [1, 5, 3], "max_tokens": 4, "logprobs": 1, **extra}
    return httpx.post(srv.url + "/v1/completions", json=body, timeout=60)


def test_an_upload_with_nan_is_a_4xx_naming_it_and_nothing_changes(server: Server) -> None:
    model, _ = load_tiny_model()
    probe, version = _probe(server), _version(server)
    url = server.url + "/ludic/update_weights"
    only_norm = {NORM: torch.full((model.config.hidden_size,), float("nan"))}
    for params, state in ({"strict": "false"}, only_norm), ({}, _nan_norm(model)):
        reply = httpx.post(url, params=params, content=_payload(state), headers=AUTH, timeout=60)
        assert reply.status_code == 400, reply.text
        assert NORM in reply.text and "nan or inf" in reply.text
    assert _probe(server) == probe and _version(server) == version
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    chat = _chat(server)
    assert chat.status_code == 200, chat.text
    logprobs = [c["logprob"] for c in chat.json()["choices"][0]["logprobs"]["content"]]
    assert logprobs and all(lp <= 0 for lp in logprobs)
    assert _completion(server).status_code == 200


def test_a_negative_or_non_integer_version_is_a_400(server: Server) -> None:
    version = _version(server)
    for bad in ("-5", "abc", "1.5"):
        reply = httpx.post(
            server.url + "/ludic/update_weights",
            params={"strict": "false", "version": bad},
            content=_payload({}),
            headers=AUTH,
            timeout=60,
        )
        assert reply.status_code == 400, (bad, reply.text)
        assert "version" in reply.text
    assert _version(server) == version


def test_a_pushed_nan_is_refused_and_never_sent_as_json(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded server receives pushes in place: the refused bytes have landed, so the
    version stays and responses whose logprobs they make nan are errors (no nan in JSON, no
    reset connection) until a finite push repairs the model over the same group."""
    # A sender that does not check (ludic's publishers refuse nan before sending).
    monkeypatch.setattr("ludic.distributed.broadcast.check_publishable", lambda *a, **k: None)
    model, _ = load_tiny_model()
    publisher = BroadcastPolicyPublisher(server.url, TOKEN, timeout_s=60, control="http")
    try:
        version = _version(server)
        with torch.no_grad():
            model.model.norm.weight.fill_(float("nan"))
        with pytest.raises(Exception, match=r"(?s)422.*nan or inf \(model\.norm\.weight\)"):
            publisher.publish(model, version=version + 1)
        assert _version(server) == version
        status = httpx.get(server.url + "/ludic/weights/status", headers=AUTH).json()
        assert status["connected"] and NORM in status["last_error"]
        assert NORM in httpx.get(server.url + "/health").json()["last_error"]
        for reply in (_chat(server), _completion(server)):
            assert reply.status_code == 500
            assert "nan or inf logprob" in reply.json()["error"]["message"]
        streamed = _chat(server, stream=True).text
        events = [json.loads(e[6:]) for e in streamed.split("\n\n") if e.startswith("data: {")]
        assert "nan or inf logprob" in events[-1]["error"]["message"]
        assert streamed.rstrip().endswith("data: [DONE]")

        fresh, _ = load_tiny_model()
        publisher.publish(fresh, version=version + 2)  # verified: the model is repaired
        assert _version(server) == version + 2
        assert _chat(server).status_code == 200
    finally:
        publisher.close()


# ---- stopping `ludic serve` while a join is pending ---------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"]
)
def test_serve_stops_promptly_while_a_join_is_pending(
    tmp_path: Path, silent_trainer: int, stop: signal.Signals, code: int
) -> None:
    """`ludic serve`, as a user starts it; the join would block for ever on this trainer."""
    port = free_port()
    args = ["serve", "--model", str(tiny_model_dir()), "--port", str(port), "--threads", "1"]
    log = (tmp_path / "serve.log").open("w")
    env = {**os.environ, TOKEN_ENV: TOKEN, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ludic.cli", *args], stdout=log, stderr=log, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        body = {"host": "127.0.0.1", "port": silent_trainer, "timeout_s": 120}
        reply = httpx.post(url + "/ludic/weights/init", json=body, headers=AUTH, timeout=30)
        assert reply.is_success, reply.text
        status = httpx.get(url + "/ludic/weights/status", headers=AUTH, timeout=30).json()
        assert status["joining"]
        process.send_signal(stop)
        assert process.wait(timeout=30) == code  # before: as long as the join (here: for ever)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def _wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, f"ludic serve exited with {process.returncode}"
        try:
            if httpx.get(url + "/health", timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("ludic serve did not become healthy in 180 s")
