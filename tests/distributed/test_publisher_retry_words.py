"""A push that fails on a server for a reason other than leaving the group is retried once over
a fresh group with one warning that reads as a sentence: "failed: <why>; retrying" (it said
"failed on server ... is not ...", gluing the server's reason to "on")."""

from __future__ import annotations

import logging

import httpx
import pytest
import torch
from distributed_fakes import ServerProcess, nudge_
from test_publisher_rejoin import _publisher, _RefusingStart

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def test_a_failed_push_is_retried_with_one_readable_warning(
    weight_server: ServerProcess, model: torch.nn.Module, caplog: pytest.LogCaptureFixture
) -> None:
    transport = _RefusingStart(503, "busy: try again", 0)
    http = httpx.Client(base_url=weight_server.url, transport=transport, timeout=30)
    publisher = _publisher(weight_server, http=http)
    publisher.publish(model, version=1)
    transport.times = 1  # the next /start fails once
    nudge_(model, 0.01)
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        publisher.publish(model, version=2)
    assert publisher.last_push is not None and publisher.last_push.retried
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith("weight push of version 2 failed: "), said
    assert "busy: try again" in said[0] and said[0].endswith("; retrying"), said
    publisher.close()
