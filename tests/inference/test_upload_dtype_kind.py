"""`ludic serve`'s `/ludic/update_weights` upload refuses a tensor of another dtype kind than
the parameter it replaces (an int64 or bool tensor into float weights: a 400 naming the
tensor and both dtypes, nothing written), and still takes floats of another width (a bf16
trainer's weights into the fp32 server, which the broadcast publishers' `wire_dtype` sends
too)."""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping

import httpx
import pytest
import torch
from safetensors.torch import save
from test_server import AUTH, Server, start_server

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import load_tiny_model, tiny_model_dir

pytestmark = pytest.mark.timeout(240)
NORM = "model.norm.weight"
PROBE = {"token_ids": [1, 5, 9, 13, 17, 21]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tiny_model_dir(), tmp_path_factory.mktemp("dtype_kind") / "server.log")
    yield srv
    srv.stop()


def _payload(state: Mapping[str, torch.Tensor]) -> bytes:
    return io.BytesIO(save({k: v.contiguous() for k, v in state.items()})).getvalue()


def _probe(srv: Server) -> list[float]:
    reply = httpx.post(srv.url + "/ludic/logprobs", json=PROBE, headers=AUTH, timeout=60)
    assert reply.status_code == 200, reply.text
    return [float(v) for v in reply.json()["logprobs"]]


def _version(srv: Server) -> int:
    return int(httpx.get(srv.url + "/ludic/version", headers=AUTH).json()["policy_version"])


def _upload(srv: Server, state: Mapping[str, torch.Tensor]) -> httpx.Response:
    url = srv.url + "/ludic/update_weights"
    return httpx.post(url, content=_payload(state), headers=AUTH, timeout=60)


def test_an_int_or_bool_tensor_into_float_weights_is_a_400_naming_it(server: Server) -> None:
    model, _ = load_tiny_model()
    probe, version = _probe(server), _version(server)
    for dtype, name in ((torch.int64, "int64"), (torch.bool, "bool")):
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state[NORM] = torch.ones(state[NORM].shape, dtype=dtype)  # cast, it would serve 1.0s
        reply = _upload(server, state)
        assert reply.status_code == 400, reply.text
        assert f"{NORM} is {name}, the model holds it as float32" in reply.text, reply.text
    assert _probe(server) == probe and _version(server) == version


def test_a_bf16_state_is_still_taken_by_an_fp32_server(server: Server) -> None:
    model, _ = load_tiny_model()
    version = _version(server)
    state = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    reply = _upload(server, state)
    assert reply.status_code == 200, reply.text
    assert reply.json()["policy_version"] == version + 1


def test_in_process_the_engine_refuses_it_before_any_write() -> None:
    model, tokenizer = load_tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with EmbeddedEngine(model, tokenizer) as engine:
        state = {NORM: torch.zeros(before[NORM].shape, dtype=torch.int64)}
        with pytest.raises(ValueError, match=f"{NORM} is int64"):
            engine.update_weights(state, strict=False)
        assert engine.policy_version == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
