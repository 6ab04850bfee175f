"""A real two-process push: the embedded server (with the weight-sync routes) in a subprocess,
the trainer here; gloo over 127.0.0.1. Served outputs and version change; a server that skips
the load is caught."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import torch
from distributed_fakes import SPEC, TOKEN, ServerProcess, nudge_, start_weight_server

from ludic.distributed import BroadcastPolicyPublisher, PublishVerificationError
from ludic.models import load_model, tiny_model_dir

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("weight-server") / "server.log"
    srv = start_weight_server(tiny_model_dir(spec=SPEC), log)
    yield srv
    srv.stop()


def _greedy_ids(server: ServerProcess) -> list[int]:
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 8, "temperature": 0.0}
    body["return_token_ids"] = True
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    ids: list[int] = reply["choices"][0]["token_ids"]
    return ids


def _served_version(server: ServerProcess) -> int:
    return int(httpx.get(server.url + "/ludic/version", headers=AUTH).json()["policy_version"])


def test_push_over_two_processes_changes_outputs_and_version(server: ServerProcess) -> None:
    model, _ = load_model(tiny_model_dir(spec=SPEC), dtype=torch.float32)
    publisher = BroadcastPolicyPublisher(server.url, TOKEN, bucket_mb=0.02, timeout_s=30)
    before = _greedy_ids(server)
    with torch.no_grad():  # a very different policy: greedy outputs must change
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    publisher.publish(model, version=1)
    assert _served_version(server) == 1
    assert _greedy_ids(server) != before

    httpx.post(server.url + "/test/sabotage", params={"skip_load": True}, timeout=10)
    try:
        nudge_(model, 0.05)
        with pytest.raises(PublishVerificationError, match="differ from the ones sent"):
            publisher.publish(model, version=2)
    finally:
        httpx.post(server.url + "/test/sabotage", params={"skip_load": False}, timeout=10)
    publisher.publish(model, version=3)  # the same group keeps working after a caught failure
    assert _served_version(server) == 3
    publisher.close()
