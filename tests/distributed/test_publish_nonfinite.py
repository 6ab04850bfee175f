"""Publishers refuse weights holding nan or inf before any byte leaves, and a server's refusal
of a push is not retried.

- A Trainer publishing to a real `ludic serve` (a subprocess on 127.0.0.1, wired as `ludic
  train --server-url` wires it: `make_inference`) whose weights turn nan stops with
  `NonFiniteWeightsError` naming the tensor, and the server keeps serving the last good
  weights (`ludic serve` receives in place: once sent, the bytes would have landed).
- Over the in-process app (TestClient, real gloo group): a push the server refuses (422)
  raises `WeightPushError`, once, over the same group, which keeps working.
- `InProcessPublisher` never hands such weights to its engine, even one that checks nothing.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from distributed_fakes import SPEC, TOKEN, ServerProcess, free_port
from fastapi.testclient import TestClient
from fixed_samples import Samples

import ludic.distributed.broadcast as broadcast_module
from ludic.distributed import BroadcastPolicyPublisher, InProcessPublisher, WeightPushError
from ludic.inference import NonFiniteWeightsError
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model, load_model, tiny_model_dir
from ludic.recipes.inference import make_inference
from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_reinforce

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NORM = "model.norm.weight"
PROBE = {"token_ids": [1, 5, 9, 13, 17, 21]}


# ---- a Trainer and `ludic serve` ----------------------------------------------------------


@pytest.fixture(scope="module")
def ludic_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`ludic serve` as a user starts it, on the small test model."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    args = ["serve", "--model", str(tiny_model_dir(spec=SPEC)), "--port", str(port)]
    args += ["--token", TOKEN, "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ludic.cli", *args], stdout=out, stderr=out, env=env
        )
    server = ServerProcess(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        _wait_healthy(server)
        yield server
    finally:
        server.stop()


def _wait_healthy(server: ServerProcess) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"ludic serve exited:\n{server.log.read_text()[-3000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"ludic serve did not become healthy:\n{server.log.read_text()[-3000:]}")


def _served(server: ServerProcess) -> tuple[int, list[float], dict[str, Any]]:
    """(policy version, probe logprobs, weights status) of the server."""
    version = httpx.get(server.url + "/ludic/version", headers=AUTH, timeout=30)
    probe = httpx.post(server.url + "/ludic/logprobs", json=PROBE, headers=AUTH, timeout=60)
    assert probe.status_code == 200, probe.text
    status = httpx.get(server.url + "/ludic/weights/status", headers=AUTH, timeout=30)
    return int(version.json()["policy_version"]), probe.json()["logprobs"], status.json()


async def test_a_diverged_trainer_stops_and_the_server_keeps_the_last_good_weights(
    ludic_serve: ServerProcess, tmp_path: Path
) -> None:
    model, tokenizer = load_model(tiny_model_dir(spec=SPEC), dtype=torch.float32)
    inference = make_inference(model, tokenizer, server_url=ludic_serve.url, server_token=TOKEN)
    try:
        checkpoints = CheckpointConfig(dir=str(tmp_path / "ckpt"), every_n_steps=1)
        trainer = Trainer(
            model,
            make_reinforce(),
            Samples(),
            TrainerConfig(lr=1e-2, checkpoint=checkpoints),
            publisher=inference.publisher,
            tokenizer=tokenizer,
        )
        await trainer.train(1, progress=False)  # published: the server serves step 1
        version, logprobs, _ = _served(ludic_serve)
        assert version == 1 and all(math.isfinite(lp) for lp in logprobs)

        def diverge(*_: Any) -> None:  # the next optimizer step leaves a nan in the weights
            with torch.no_grad():
                trainer.model.get_parameter(NORM)[3] = float("nan")

        trainer.optimizer.register_step_post_hook(diverge)
        with pytest.raises(NonFiniteWeightsError) as caught:
            await trainer.train(3, progress=False)
        assert caught.value.names == [NORM]
        message = str(caught.value)
        assert f"nan or inf ({NORM})" in message and "The policy diverged" in message
        assert "lower the learning rate" in message and "grad_norm" in message
        assert "Nothing was sent" in message and "stopped at step 2" in message
        assert str(trainer.checkpoints.path_for(1)) in message  # the one to resume from
        assert trainer.step == 2  # the run stopped at the refused publish, no step after it

        after, logprobs_after, status = _served(ludic_serve)
        assert after == 1 and logprobs_after == logprobs  # the last good weights, unchanged
        assert status["connected"] and status["last_error"] is None  # nothing was received
    finally:
        await inference.aclose()


# ---- a refusal by the server is not retried ------------------------------------------------


@pytest.fixture
def app_client() -> Iterator[tuple[TestClient, EmbeddedEngine, torch.nn.Module]]:
    """The embedded server app over an engine receiving in place (as `ludic serve` does)."""
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
    app = create_app(engine, model_name="tiny", token=TOKEN)
    with TestClient(app, base_url="http://testserver") as client:
        yield client, engine, model
    engine.close()


@pytest.mark.parametrize("control", ["store", "http"])
def test_a_push_the_server_refuses_raises_once_and_the_group_stays(
    app_client: tuple[TestClient, EmbeddedEngine, torch.nn.Module],
    monkeypatch: pytest.MonkeyPatch,
    control: str,
) -> None:
    client, engine, model = app_client
    publisher = BroadcastPolicyPublisher(
        "http://testserver",
        TOKEN,
        http=client,
        timeout_s=20,
        control=control,  # type: ignore[arg-type]
    )
    connects = []
    connect = publisher.fleet.connect
    monkeypatch.setattr(publisher.fleet, "connect", lambda *a: (connects.append(1), connect(*a)))
    try:
        publisher.publish(model, version=1)
        assert len(connects) == 1 and engine.policy_version == 1
        # A sender without the check (an older trainer): the server refuses with a 422.
        monkeypatch.setattr(broadcast_module, "check_publishable", lambda *a, **k: None)
        with torch.no_grad():
            model.get_parameter(NORM)[0] = float("nan")
        with pytest.raises(WeightPushError, match=r"\(422\).*not retried") as caught:
            publisher.publish(model, version=2)
        assert NORM in str(caught.value)
        assert len(connects) == 1  # not retried over a new group
        assert publisher.fleet.group is not None and not publisher.missed
        assert engine.policy_version == 1
        with torch.no_grad():
            model.get_parameter(NORM)[0] = 1.0
        publisher.publish(model, version=3)  # verified, over the same group
        assert len(connects) == 1 and engine.policy_version == 3
    finally:
        publisher.close()


def test_broadcast_refuses_before_contacting_any_server(
    app_client: tuple[TestClient, EmbeddedEngine, torch.nn.Module],
) -> None:
    client, engine, model = app_client
    publisher = BroadcastPolicyPublisher(
        "http://testserver", TOKEN, http=client, timeout_s=20, wire_dtype=torch.float16
    )
    try:
        with torch.no_grad():  # finite in float32, inf once cast to the wire's float16
            model.get_parameter(NORM)[1] = 1e6
        with pytest.raises(NonFiniteWeightsError, match=rf"version 1: 1 tensor.*\({NORM}\)"):
            publisher.publish(model, version=1)
        assert publisher.fleet.group is None  # never joined: the server saw nothing
        status = client.get("/ludic/weights/status", headers=AUTH).json()
        assert not status["connected"] and engine.policy_version == 0
    finally:
        publisher.close()


# ---- in process ---------------------------------------------------------------------------


class UncheckedEngine:
    """An engine that loads whatever it is given (checks nothing), recording each call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.loads: list[int | None] = []

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, version: int | None = None
    ) -> int:
        self.loads.append(version)
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.model.load_state_dict(dict(state))
        return -1 if version is None else version

    def logprobs(self, token_ids: Any) -> list[float]:
        return [0.0] * (len(token_ids) - 1)


@pytest.mark.parametrize("verify", [True, False])
def test_in_process_refuses_before_the_engine_gets_anything(verify: bool) -> None:
    model, _ = build_tiny_model(seed=0, spec=SPEC)
    engine = UncheckedEngine(copy.deepcopy(model))
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with torch.no_grad():
        model.get_parameter(NORM)[2] = float("-inf")
    publisher = InProcessPublisher(engine, verify=verify)
    with pytest.raises(NonFiniteWeightsError, match="The policy diverged") as caught:
        publisher.publish(model, version=4)
    assert caught.value.names == [NORM] and engine.loads == []
    assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in before.items())
