"""A trainer whose weight-sync group another trainer replaced rejoins at once.

The embedded server (`ludic serve`'s app with the weight-sync routes) in a subprocess, pushes
driven through the trainer's TCPStore (`control="store"`), or over HTTP (`control="http"`: the
server refuses a `/start` naming another trainer's store, so it never waits on a group that
sends nothing). A second trainer that joins the
server replaces the first one's group; the server then frees the old group, closing its
connections, so the first trainer's next broadcast fails at once and its publisher rejoins
(a new `/init`) and retries, instead of broadcasting into a group nobody receives from until
`timeout_s`. Also when the second trainer stays joined: the server's status names the store
of the group it holds, so the first trainer learns it was replaced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import httpx
import pytest
import torch
from distributed_fakes import SPEC, TOKEN, ServerProcess, nudge_, start_weight_server

from ludic.distributed import BroadcastPolicyPublisher
from ludic.models import load_model, tiny_model_dir

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 60.0  # the publisher's; a replaced trainer must not wait anywhere near it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("weight-server") / "server.log"
    srv = start_weight_server(tiny_model_dir(spec=SPEC), log)
    yield srv
    srv.stop()


@pytest.fixture()
def model() -> torch.nn.Module:
    loaded, _ = load_model(tiny_model_dir(spec=SPEC), dtype=torch.float32)
    return loaded


def _publisher(server: ServerProcess, control: str) -> BroadcastPolicyPublisher:
    return BroadcastPolicyPublisher(
        server.url,
        TOKEN,
        control=control,  # type: ignore[arg-type]
        bucket_mb=0.02,
        timeout_s=TIMEOUT_S,
    )


def _served_version(server: ServerProcess) -> int:
    return int(httpx.get(server.url + "/ludic/version", headers=AUTH).json()["policy_version"])


@pytest.mark.parametrize(
    ("control", "second_closes"),
    [("store", False), ("store", True), ("http", False)],
    ids=["store-second-stays", "store-second-closes", "http-second-stays"],
)
def test_a_replaced_group_rejoins_at_once(
    server: ServerProcess,
    model: torch.nn.Module,
    caplog: pytest.LogCaptureFixture,
    control: str,
    second_closes: bool,
) -> None:
    first = _publisher(server, control)
    first.publish(model, version=1)
    nudge_(model, 0.01)
    first.publish(model, version=2)  # the layout is accepted: the next push sends no manifest
    second = _publisher(server, control)
    nudge_(model, 0.01)
    second.publish(model, version=3)  # replaces the first trainer's group on the server
    status = httpx.get(server.url + "/ludic/weights/status", headers=AUTH).json()
    assert status["control"] == control and status["store"] is not None
    if second_closes:
        second.close()
    nudge_(model, 0.01)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        first.publish(model, version=4)  # verified: checksums and probe on the new group
    waited = time.monotonic() - started
    assert waited < TIMEOUT_S / 2, f"the replaced trainer waited {waited:.1f} s to rejoin"
    assert first.last_push is not None and first.last_push.retried
    assert _served_version(server) == 4
    said = " ".join(r.getMessage() for r in caplog.records)
    assert ("retrying" in said or "rejoined" in said) and server.url in said, said
    if not second_closes:
        assert "another trainer's weight-sync group" in said, said
    nudge_(model, 0.01)
    first.publish(model, version=5)  # the rejoined group keeps working
    assert _served_version(server) == 5 and not first.last_push.retried
    first.close()
    if not second_closes:
        second.close()
