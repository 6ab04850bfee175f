"""A push whose manifest sends a tensor in another dtype kind than the server holds it (the
trainer's float buffer where the served model has an int64 one) is refused at the manifest,
before any byte moves: a `PushRefused` naming the tensor and both dtypes, the served weights
untouched. A bf16 wire for the fp32 weights (`wire_dtype`) still lands. A real embedded server
in process (FastAPI TestClient)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from distributed_fakes import SPEC, TOKEN
from fastapi.testclient import TestClient

from ludic.distributed import BroadcastPolicyPublisher, PushRefused
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


class Client(TestClient):
    def request(self, method: str, url: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        kwargs.pop("timeout", None)  # TestClient deprecates it; nothing here is slow
        return super().request(method, url, **kwargs)


def _model(steps_dtype: torch.dtype) -> torch.nn.Module:
    model = build_tiny_model(seed=0, spec=SPEC)[0]
    model.register_buffer("steps", torch.arange(3).to(steps_dtype))  # persistent: in the state
    return model


@pytest.fixture
def served() -> Iterator[tuple[Client, EmbeddedEngine]]:
    """An embedded server at http://served whose model holds an int64 buffer `steps`."""
    model = _model(torch.int64)
    engine = EmbeddedEngine(copy.deepcopy(model), build_tiny_model(seed=0, spec=SPEC)[1])
    client = Client(create_app(engine, model_name="m", token=TOKEN), base_url="http://served")
    with client:
        yield client, engine
    engine.close()


def _push(client: Client, model: torch.nn.Module, **kwargs: Any) -> None:
    publisher = BroadcastPolicyPublisher(
        ["http://served"], TOKEN, http=[client], timeout_s=20, **kwargs
    )
    try:
        publisher.publish(model, version=1)
    finally:
        publisher.close()


def test_a_float_buffer_for_an_int_one_is_refused_before_any_byte_moves(
    served: tuple[Client, EmbeddedEngine],
) -> None:
    client, engine = served
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    trainer = _model(torch.float32)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.5)
    with pytest.raises(PushRefused) as caught:
        _push(client, trainer)
    message = str(caught.value)
    assert "refused (400)" in message and "steps: sent float32, served int64" in message, message
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused push wrote weights"


def test_a_bf16_wire_for_fp32_weights_still_lands(served: tuple[Client, EmbeddedEngine]) -> None:
    client, engine = served
    _push(client, _model(torch.int64), wire_dtype=torch.bfloat16, atol=0.05)  # bf16 rounding
    assert engine.policy_version == 1
