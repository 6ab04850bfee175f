"""A publisher whose server left its weight-sync group rejoins once and retries the push.

The embedded server (`ludic serve`'s app with the weight-sync routes) in a subprocess, pushes
driven over HTTP (`control="http"`, as to vLLM). A server that answers `/start` with "no
communicator" (it restarted and forgot the group; here a transport refuses one `/start` so)
is answered with a new `/init` + join and one retry (one log line). A server that refuses
again is named in a `WeightPushError`; other refusals are not retried, nor is a server that
says another trainer replaced this one (`test_publisher_replaced_store`).
"""

from __future__ import annotations

import logging

import httpx
import pytest
import torch
from distributed_fakes import TOKEN, ServerProcess, nudge_

from ludic.distributed import BroadcastPolicyPublisher, WeightPushError

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REJOINED = "rejoined"


def _served_version(server: ServerProcess) -> int:
    return int(httpx.get(server.url + "/ludic/version", headers=AUTH).json()["policy_version"])


class _RefusingStart(httpx.HTTPTransport):
    """Forwards to the real server, except that every `/ludic/weights/start` is refused with
    `message` (counts the `/init` requests that went through)."""

    def __init__(self, status: int, message: str, times: int | None = None) -> None:
        super().__init__()
        self.status, self.message, self.inits, self.times = status, message, 0, times

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ludic/weights/init":
            self.inits += 1
        if request.url.path == "/ludic/weights/start" and self.times != 0:
            self.times = None if self.times is None else self.times - 1
            return httpx.Response(self.status, json={"error": {"message": self.message}})
        return super().handle_request(request)


def _publisher(server: ServerProcess, **kwargs: object) -> BroadcastPolicyPublisher:
    return BroadcastPolicyPublisher(
        server.url, TOKEN, control="http", bucket_mb=0.02, timeout_s=30, **kwargs
    )


def test_a_server_that_forgot_the_group_is_rejoined_once(
    weight_server: ServerProcess, model: torch.nn.Module, caplog: pytest.LogCaptureFixture
) -> None:
    transport = _RefusingStart(409, "no communicator: POST /ludic/weights/init first", 0)
    http = httpx.Client(base_url=weight_server.url, transport=transport, timeout=30)
    first = _publisher(weight_server, http=http)
    first.publish(model, version=1)
    transport.times = 1  # the next /start is refused as by a server that restarted
    nudge_(model, 0.01)
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        first.publish(model, version=3)  # verified: checksums and probe on the rejoined group
    assert _served_version(weight_server) == 3
    assert first.last_push is not None and first.last_push.retried
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and REJOINED in said[0] and "no communicator" in said[0], said
    nudge_(model, 0.01)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        first.publish(model, version=4)  # the rejoined group keeps working, no retry
    assert _served_version(weight_server) == 4 and not first.last_push.retried
    assert not caplog.records
    first.close()


def test_a_server_that_refuses_again_after_the_rejoin_is_named(
    weight_server: ServerProcess, model: torch.nn.Module
) -> None:
    transport = _RefusingStart(409, "no communicator: POST /ludic/weights/init first")
    http = httpx.Client(base_url=weight_server.url, transport=transport, timeout=30)
    publisher = _publisher(weight_server, http=http)
    with pytest.raises(WeightPushError) as caught:
        publisher.publish(model, version=5)
    said = str(caught.value)
    assert "failed again after rejoining" in said and "no communicator" in said, said
    assert weight_server.url in said
    assert transport.inits == 2  # the first connect and one rejoin, no more
    publisher.close()


def test_a_refusal_that_is_not_about_the_group_is_not_retried(
    weight_server: ServerProcess, model: torch.nn.Module
) -> None:
    transport = _RefusingStart(400, "refused weight manifest: a shape differs")
    http = httpx.Client(base_url=weight_server.url, transport=transport, timeout=30)
    publisher = _publisher(weight_server, http=http)
    with pytest.raises(WeightPushError, match="refused weight manifest") as caught:
        publisher.publish(model, version=6)
    assert "rejoin" not in str(caught.value)
    assert transport.inits == 1  # the server is in the group: no rejoin
    publisher.close()
