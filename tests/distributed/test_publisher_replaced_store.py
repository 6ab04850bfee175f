"""A trainer whose weight-sync group another trainer replaced stops loudly, at once.

The embedded server (`ludic serve`'s app with the weight-sync routes) in a subprocess, pushes
driven through the trainer's TCPStore (`control="store"`) or over HTTP (`control="http"`). A
second trainer that joins the server replaces the first one's group: the server logs one line
naming both, frees the old group (so the first trainer's next broadcast fails at once instead
of at `timeout_s`) and refuses the first trainer's pushes from then on, naming the second
(its host and pid). The first publisher raises `TrainerReplaced` and does not rejoin (the two
would take the server from each other at every push), also when the second trainer has
closed its group since, and at every later `publish`. With `take_over=True` it takes the
server back deliberately, with a warning, and the second trainer is refused in turn.
"""

from __future__ import annotations

import logging
import os

import httpx
import pytest
import torch
from distributed_fakes import TOKEN, ServerProcess, nudge_

from ludic.distributed.broadcast import BroadcastPolicyPublisher, TrainerReplaced
from ludic.errors import is_refusal

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 600.0  # the publisher's: a replaced trainer that waited for it fails the test
REPLACED_LINE = "joined and replaced the group of"


def _publisher(server: ServerProcess, control: str, **kwargs: object) -> BroadcastPolicyPublisher:
    return BroadcastPolicyPublisher(
        server.url,
        TOKEN,
        control=control,  # type: ignore[arg-type]
        bucket_mb=0.02,
        timeout_s=TIMEOUT_S,
        **kwargs,  # type: ignore[arg-type]
    )


def _served_version(server: ServerProcess) -> int:
    return int(httpx.get(server.url + "/ludic/version", headers=AUTH).json()["policy_version"])


def _replacements_logged(server: ServerProcess) -> int:
    return server.log.read_text(errors="replace").count(REPLACED_LINE)


@pytest.mark.parametrize(
    ("control", "second_closes"),
    [("store", False), ("store", True), ("http", False), ("http", True)],
    ids=["store-second-stays", "store-second-closes", "http-second-stays", "http-second-closes"],
)
def test_a_replaced_trainer_is_refused_naming_the_other(
    weight_server: ServerProcess, model: torch.nn.Module, control: str, second_closes: bool
) -> None:
    first = _publisher(weight_server, control)
    first.publish(model, version=1)
    nudge_(model, 0.01)
    first.publish(model, version=2)  # the layout is accepted: the next push sends no manifest
    logged = _replacements_logged(weight_server)
    second = _publisher(weight_server, control)
    nudge_(model, 0.01)
    second.publish(model, version=3)  # replaces the first trainer's group on the server
    assert _replacements_logged(weight_server) == logged + 1  # one line per replacement
    if second_closes:
        second.close()
    nudge_(model, 0.01)
    with pytest.raises(TrainerReplaced) as caught:
        first.publish(model, version=4)
    said = str(caught.value)
    assert "replaced by another trainer" in said and weight_server.url in said, said
    assert f"pid {os.getpid()}" in said and "take_over=True" in said, said
    assert is_refusal(caught.value)  # `ludic train` ends with this message, no traceback
    assert _served_version(weight_server) == 3  # the first trainer did not take the server back
    with pytest.raises(TrainerReplaced):  # again, without rejoining
        first.publish(model, version=5)
    assert _served_version(weight_server) == 3
    assert _replacements_logged(weight_server) == logged + 1
    if not second_closes:
        nudge_(model, 0.01)
        second.publish(model, version=6)  # the second trainer's group was never disturbed
        assert second.last_push is not None and not second.last_push.retried
        assert _served_version(weight_server) == 6
        second.close()
    first.close()  # refused or a no-op: it frees nothing


def test_take_over_takes_the_server_back_with_a_warning(
    weight_server: ServerProcess, model: torch.nn.Module, caplog: pytest.LogCaptureFixture
) -> None:
    first = _publisher(weight_server, "store", take_over=True)
    first.publish(model, version=1)
    second = _publisher(weight_server, "store")
    nudge_(model, 0.01)
    second.publish(model, version=2)
    nudge_(model, 0.01)
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        first.publish(model, version=3)  # verified: checksums and probe on the new group
    assert first.last_push is not None and first.last_push.retried
    assert _served_version(weight_server) == 3
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "take_over=True" in said and "replaced by another trainer" in said, said
    nudge_(model, 0.01)
    with pytest.raises(TrainerReplaced):  # the second one may not take over: it stops
        second.publish(model, version=4)
    nudge_(model, 0.01)
    first.publish(model, version=5)
    assert _served_version(weight_server) == 5 and not first.last_push.retried
    first.close()
