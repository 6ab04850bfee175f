"""Each weight-sync group a server joins has an identity, so that what an old (replaced)
trainer still sends cannot touch the newer trainer's group.

The embedded server (`ludic serve`'s app with the weight-sync routes) in a subprocess. A stray
`/close` from a trainer another one replaced is refused (409, naming the replacement) and frees
nothing: the newer trainer keeps pushing on its group without a retry. A receive in flight on
a group that another trainer's join replaces (here: a trainer that started a push and never
sends its bytes, with a 600 s timeout) ends at once: the newer trainer's push goes through
(before, it waited behind that receive, which held the served model, until the timeout), and
the old push's `/finish` is refused naming the trainer that replaced it.
"""

from __future__ import annotations

import logging
import os

import httpx
import pytest
import torch
from distributed_fakes import TOKEN, ServerProcess, nudge_

from ludic.distributed.broadcast import BroadcastPolicyPublisher
from ludic.distributed.manifest import plan_manifest
from ludic.distributed.transfer import host_store, open_group

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LONG_S = 600.0  # longer than the test may run: waiting for it fails the test


def _publisher(server: ServerProcess, control: str) -> BroadcastPolicyPublisher:
    return BroadcastPolicyPublisher(
        server.url,
        TOKEN,
        control=control,  # type: ignore[arg-type]
        bucket_mb=0.02,
        timeout_s=LONG_S,
    )


def _status(server: ServerProcess, group: str | None = None) -> dict[str, object]:
    query = "" if group is None else f"?group={group}"
    return dict(httpx.get(server.url + "/ludic/weights/status" + query, headers=AUTH).json())


def _served_version(server: ServerProcess) -> int:
    return int(httpx.get(server.url + "/ludic/version", headers=AUTH).json()["policy_version"])


@pytest.mark.parametrize("control", ["store", "http"])
def test_a_stray_close_from_a_replaced_trainer_frees_nothing(
    weight_server: ServerProcess,
    model: torch.nn.Module,
    caplog: pytest.LogCaptureFixture,
    control: str,
) -> None:
    first = _publisher(weight_server, control)
    first.publish(model, version=1)
    old_group = first.servers[0].group
    assert old_group is not None
    second = _publisher(weight_server, control)
    nudge_(model, 0.01)
    second.publish(model, version=2)
    held = _status(weight_server)["group"]
    assert held == second.servers[0].group != old_group
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.server_group"):
        first.close()  # has not pushed since: it does not know it was replaced
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "replaced by another trainer" in said and f"pid {os.getpid()}" in said, said
    reply = httpx.post(
        weight_server.url + "/ludic/weights/close", headers=AUTH, json={"group": old_group}
    )
    assert reply.status_code == 409 and "replaced by another trainer" in reply.text
    status = _status(weight_server, old_group)
    assert status["connected"] and status["group"] == held
    assert "replaced by another trainer" in str(status["replaced_by"])
    nudge_(model, 0.01)
    second.publish(model, version=3)  # its group is intact: no rejoin, no retry
    assert second.last_push is not None and not second.last_push.retried
    assert _served_version(weight_server) == 3
    second.close()
    assert not _status(weight_server)["connected"]


def test_replacing_a_group_ends_its_receive_in_flight(
    weight_server: ServerProcess, model: torch.nn.Module
) -> None:
    # The old trainer: joins, starts a push (the server receives into its live weights,
    # generation paused), then never broadcasts, as a trainer that hung would.
    store = host_store("127.0.0.1", 0, world_size=2, timeout_s=LONG_S)
    init = {
        "host": "127.0.0.1",
        "port": store.port,
        "timeout_s": LONG_S,
        "trainer": {"id": "stalled-trainer", "host": "elsewhere", "pid": 1},
    }
    reply = httpx.post(weight_server.url + "/ludic/weights/init", headers=AUTH, json=init).json()
    old_group = reply["group"]
    stalled = open_group(store, rank=0, world_size=2, backend="gloo", timeout_s=LONG_S)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    manifest = plan_manifest(state, version=7, bucket_bytes=2**14).to_json()
    started = httpx.post(
        weight_server.url + "/ludic/weights/start",
        headers=AUTH,
        json={**manifest, "group": old_group},
    )
    assert started.is_success, started.text
    assert _status(weight_server)["in_progress"]

    newer = _publisher(weight_server, "store")
    nudge_(model, 0.02)
    newer.publish(model, version=8)  # verified; before the fix it waited behind the receive
    assert _served_version(weight_server) == 8 and not newer.last_push.retried  # type: ignore[union-attr]

    finish = httpx.post(
        weight_server.url + "/ludic/weights/finish",
        headers=AUTH,
        json={"group": old_group},
        timeout=30,
    )
    assert finish.status_code == 409, finish.text
    assert "replaced by another trainer" in finish.text and f"pid {os.getpid()}" in finish.text
    newer.close()
    del stalled  # its socket closes: the server's abandoned receive ends
    del store
