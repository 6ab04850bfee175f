"""The server-side weight-sync routes on a bare FastAPI app: auth, state machine, manifest
checks, a push that loads every tensor at once with the manifest's version, and joins
abandoned (a `/close`, or the process exiting) before their trainer's store answered."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ludic.distributed.checksum import checksums
from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import BufferPool, host_store, open_group, send_buckets
from ludic.inference.http.weight_routes import install_weight_sync_routes

pytestmark = pytest.mark.timeout(60)
TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeEngine:
    """Records every update; a 2-layer linear model stands in for the served LM."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        self.updates: list[tuple[dict[str, torch.Tensor], int | None, bool]] = []

    def update_weights(
        self, state: Mapping[str, torch.Tensor], *, version: int | None = None, strict: bool = True
    ) -> int:
        self.updates.append(({k: v.clone() for k, v in state.items()}, version, strict))
        self.model.load_state_dict(dict(state), strict=strict)
        return version if version is not None else -1


def _client(token: str | None = TOKEN) -> tuple[TestClient, FakeEngine]:
    engine = FakeEngine()
    app = FastAPI()
    install_weight_sync_routes(app, engine, token)
    return TestClient(app), engine


def _manifest(engine: FakeEngine, version: int = 1) -> dict[str, Any]:
    return plan_manifest(engine.model.state_dict(), version=version, bucket_bytes=32).to_json()


def test_routes_need_the_token() -> None:
    client, _ = _client(token=None)
    assert client.get("/ludic/weights/status", headers=AUTH).status_code == 403
    client, _ = _client()
    assert client.get("/ludic/weights/status").status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert client.post("/ludic/weights/init", headers=bad, json={}).status_code == 401
    status = client.get("/ludic/weights/status", headers=AUTH).json()
    assert status == {
        "connected": False,
        "joining": False,
        "join_error": None,
        "in_progress": False,
        "last_version": None,
        "last_error": None,
        "control": "http",
        "controls": ["http", "store"],
        "store": None,  # the trainer store of the group it holds (none yet)
        "dtype": "float32",  # the served dtype: the publisher's probe tolerance follows it
        "pieces": True,  # it receives buckets in pieces: the publisher may send them so
        "device": "cpu",  # where it serves: a CUDA trainer picks NCCL or gloo by it
        "device_uuid": None,
    }


def test_out_of_order_calls_are_refused() -> None:
    client, engine = _client()
    reply = client.post("/ludic/weights/start", headers=AUTH, json=_manifest(engine))
    assert reply.status_code == 409 and "POST /ludic/weights/init first" in reply.text
    reply = client.post("/ludic/weights/finish", headers=AUTH)
    assert reply.status_code == 409 and "no push in progress" in reply.text


def test_malformed_manifest_is_a_400() -> None:
    client, _ = _client()
    reply = client.post("/ludic/weights/start", headers=AUTH, json={"version": 1})
    assert reply.status_code == 400 and "malformed weight manifest" in reply.text


def test_push_loads_all_tensors_once_with_the_version() -> None:
    client, engine = _client()
    new = {k: torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    manifest = plan_manifest(new, version=5, bucket_bytes=32)
    store = host_store("127.0.0.1", 0, world_size=2, timeout_s=20)
    body = {"host": "127.0.0.1", "port": store.port, "timeout_s": 20}
    assert client.post("/ludic/weights/init", headers=AUTH, json=body).json() == {
        "status": "joining"
    }
    group = open_group(store, rank=0, world_size=2, backend="gloo", timeout_s=20)

    wrong = plan_manifest({"0.weight": torch.zeros(9)}, version=5, bucket_bytes=32).to_json()
    reply = client.post("/ludic/weights/start", headers=AUTH, json=wrong)
    assert reply.status_code == 400 and "0.weight: sent (9,), served (3, 4)" in reply.text

    assert client.post("/ludic/weights/start", headers=AUTH, json=manifest.to_json()).is_success
    again = client.post("/ludic/weights/start", headers=AUTH, json=manifest.to_json())
    assert again.status_code == 409 and "already in progress" in again.text
    send_buckets(group, manifest, new, pool=BufferPool("cpu"))
    reply = client.post("/ludic/weights/finish", headers=AUTH).json()
    # The reply carries checksums of what the model holds after the load: the sent tensors'.
    held = {name: list(c) for name, c in checksums(new).items()}
    assert reply == {
        "policy_version": 5,
        "num_tensors": 4,
        "num_bytes": manifest.total_bytes,
        "checksums": held,
        "held_dtypes": {},
    }
    assert len(engine.updates) == 1  # one load, after every bucket arrived
    loaded, version, strict = engine.updates[0]
    assert version == 5 and strict is True
    assert all(torch.equal(loaded[k], v) for k, v in new.items())
    status = client.get("/ludic/weights/status", headers=AUTH).json()
    assert status["connected"] and status["last_version"] == 5 and not status["in_progress"]


class InPlaceEngine(FakeEngine):
    """Receives in place; `after_fill(model)` runs once the buckets have landed, inside the
    update (a stand-in for an engine that touches the weights after receiving them)."""

    def __init__(self, after_fill: Any = None) -> None:
        super().__init__()
        self.after_fill = after_fill

    filling = False  # inside fill(): the buckets are arriving

    def update_weights_in_place(self, fill: Any, *, version: int | None = None) -> int:
        with torch.no_grad():
            self.filling = True
            fill(self.model)
            self.filling = False
            if self.after_fill is not None:
                self.after_fill(self.model)
        return version if version is not None else -1


def _push(
    engine: FakeEngine, new: dict[str, torch.Tensor], *, verified: bool, piece_bytes: int = 0
) -> dict[str, Any]:
    """One push of `new` over HTTP control; the /finish reply."""
    app = FastAPI()
    install_weight_sync_routes(app, engine, TOKEN)
    client = TestClient(app)
    manifest = plan_manifest(
        new, version=5, bucket_bytes=32, checksums=verified, piece_bytes=piece_bytes
    )
    store = host_store("127.0.0.1", 0, world_size=2, timeout_s=20)
    body = {"host": "127.0.0.1", "port": store.port, "timeout_s": 20}
    assert client.post("/ludic/weights/init", headers=AUTH, json=body).is_success
    group = open_group(store, rank=0, world_size=2, backend="gloo", timeout_s=20)
    assert client.post("/ludic/weights/start", headers=AUTH, json=manifest.to_json()).is_success
    send_buckets(group, manifest, new, pool=BufferPool("cpu"))
    reply: dict[str, Any] = client.post("/ludic/weights/finish", headers=AUTH).json()
    return reply


def test_checksums_are_taken_as_pieces_land_and_not_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ludic.distributed.checksum as checksum_module

    engine = InPlaceEngine()
    read: list[tuple[str, int, bool]] = []
    after: list[str] = []
    advance, whole = checksum_module.RunningChecksums.advance, checksum_module.checksums

    def reading(self: Any, name: str, tensor: torch.Tensor, upto: int, **kwargs: Any) -> None:
        read.append((name, upto, engine.filling))
        advance(self, name, tensor, upto, **kwargs)

    def again(tensors: Mapping[str, torch.Tensor], **kwargs: Any) -> Any:
        after.extend(tensors)
        return whole(tensors, **kwargs)

    monkeypatch.setattr(checksum_module.RunningChecksums, "advance", reading)
    monkeypatch.setattr(checksum_module, "checksums", again)
    new = {k: torch.randn_like(v) for k, v in engine.model.state_dict().items()}
    reply = _push(engine, new, verified=True, piece_bytes=16)  # "0.weight": 3 pieces of 4
    pushed, again_read = list(read), list(after)  # what the push read (not the sums below)
    assert reply["checksums"] == {name: list(c) for name, c in whole(new).items()}
    # Each tensor read as its pieces landed, while the buckets were still arriving, up to
    # its end; none read again after the load.
    assert [(n, u) for n, u, _ in pushed if n == "0.weight"] == [
        ("0.weight", 4),
        ("0.weight", 8),
        ("0.weight", 12),
    ]
    assert all(filling for _, _, filling in pushed)
    assert {n for n, u, _ in pushed if u == new[n].numel()} == set(new)
    assert again_read == []


def test_weights_touched_after_they_landed_are_checksummed_as_held() -> None:
    old = InPlaceEngine().model.state_dict()

    def undo(model: torch.nn.Module) -> None:
        model[0].weight.copy_(old["0.weight"])  # an in-place write after the bucket landed
        model[1].bias.data = old["1.bias"].clone()  # a parameter given other memory

    engine = InPlaceEngine(after_fill=undo)
    engine.model.load_state_dict(old)
    new = {k: torch.randn_like(v) for k, v in old.items()}
    reply = _push(engine, new, verified=True)
    held = engine.model.state_dict()
    assert reply["checksums"] == {name: list(c) for name, c in checksums(held).items()}
    sent = checksums(new)
    differ = {name for name, c in reply["checksums"].items() if tuple(c) != sent[name]}
    assert differ == {"0.weight", "1.bias"}


def test_an_unverified_push_skips_the_checksums() -> None:
    for engine in (FakeEngine(), InPlaceEngine()):
        new = {k: torch.randn_like(v) for k, v in engine.model.state_dict().items()}
        reply = _push(engine, new, verified=False)
        assert reply["policy_version"] == 5 and "checksums" not in reply
        assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in new.items())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_close_ends_a_join_still_waiting_for_its_store() -> None:
    # Nothing listens at the store: the join waited inside c10d for its whole timeout_s after
    # the /close that abandoned it (a thread c10d could not be asked to leave).
    client, _ = _client()
    before = set(threading.enumerate())
    body = {"host": "127.0.0.1", "port": _closed_port(), "timeout_s": 60}
    assert client.post("/ludic/weights/init", headers=AUTH, json=body).is_success
    joins = [t for t in set(threading.enumerate()) - before if t.name == "ludic-weights-join"]
    assert len(joins) == 1
    assert client.post("/ludic/weights/close", headers=AUTH).is_success
    joins[0].join(timeout=30)  # ends at once now; 60 s (its timeout) before
    assert not joins[0].is_alive()
    status = client.get("/ludic/weights/status", headers=AUTH).json()
    assert not status["joining"] and status["last_error"] is None  # abandoned, not failed


@pytest.mark.parametrize("abandoned", [True, False])
def test_a_join_pending_at_exit_does_not_abort_the_process(abandoned: bool) -> None:
    # A join aimed at a store nobody listens at, abandoned (as a /close does) or still pending
    # when the interpreter exits; an object whose __del__ keeps the finalizing interpreter
    # busy past the join's 1 s timeout: the join's thread came back from c10d then and
    # aborted the process ("terminate called without an active exception", exit 134).
    script = textwrap.dedent(
        f"""
        import time
        from ludic.inference.http.weight_join import InitRequest, join_in_background

        class HoldsFinalization:
            def __del__(self) -> None:
                time.sleep(2.5)  # past the join's timeout, while the interpreter finalizes

        req = InitRequest(host="127.0.0.1", port={_closed_port()}, timeout_s=1)
        joining = join_in_background(req)
        if {abandoned}:
            assert joining.cancel()
        held = HoldsFinalization()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr and "c10d" not in done.stderr, done.stderr
