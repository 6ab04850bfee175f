"""One pass, not two: a Trainer checks its own (local) weights for nan/inf before the gather and
publishes within `finite_checked()`, so the publisher skips its pre-send pass over the gathered
state; a publisher used alone still checks, and a wire cast that narrows the range (float32 to
float16 can overflow to inf) is still checked after the Trainer's pass.

Single process, a `BroadcastPolicyPublisher` to the embedded server app over TestClient (a real
gloo group), as in test_publish_nonfinite.py."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from distributed_fakes import SPEC, TOKEN
from fastapi.testclient import TestClient
from fixed_samples import Samples

import ludic.inference.weights as weights_module
from ludic.distributed import BroadcastPolicyPublisher
from ludic.distributed.interfaces import finite_checked
from ludic.inference import NonFiniteWeightsError
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.server import create_app
from ludic.models import build_tiny_model
from ludic.training import Trainer, TrainerConfig, make_reinforce

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]
NORM = "model.norm.weight"


class Passes:
    """Counts the publisher's pre-send passes: `check_finite` called by `check_publishable`
    (the server's own check of what it receives is not counted)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = weights_module.check_finite

        def spy(state: Mapping[str, torch.Tensor]) -> None:
            if sys._getframe(1).f_code.co_name == "check_publishable":
                self.count += 1
            real(state)

        monkeypatch.setattr(weights_module, "check_finite", spy)


@pytest.fixture
def served() -> Iterator[tuple[TestClient, EmbeddedEngine, torch.nn.Module]]:
    model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
    app = create_app(engine, model_name="tiny", token=TOKEN)
    with TestClient(app, base_url="http://testserver") as client:
        yield client, engine, model
    engine.close()


def _trainer(model: torch.nn.Module, publisher: BroadcastPolicyPublisher) -> Trainer:
    return Trainer(model, make_reinforce(), Samples(), TrainerConfig(lr=1e-2), publisher=publisher)


def _diverge(trainer: Trainer, value: float) -> None:
    def hook(*_: Any) -> None:
        with torch.no_grad():
            trainer.model.get_parameter(NORM)[3] = value

    trainer.optimizer.register_step_post_hook(hook)


async def test_a_trainer_publish_runs_the_pre_send_pass_once_not_twice(
    served: tuple[TestClient, EmbeddedEngine, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, engine, model = served
    publisher = BroadcastPolicyPublisher("http://testserver", TOKEN, http=client, timeout_s=20)
    passes = Passes(monkeypatch)
    try:
        trainer = _trainer(model, publisher)
        await trainer.train(2, progress=False)
        assert engine.policy_version == 2  # both published (and verified)
        assert passes.count == 0  # the Trainer checked its weights: no second pass
        publisher.publish(trainer.model, version=3)  # the same publisher, used alone
        assert passes.count == 1 and engine.policy_version == 3
        with finite_checked():  # the flag is scoped to the Trainer's call
            publisher.publish(trainer.model, version=4)
        assert passes.count == 1
        publisher.publish(trainer.model, version=5)
        assert passes.count == 2 and engine.policy_version == 5
    finally:
        publisher.close()


async def test_the_trainer_refuses_nan_before_gathering_or_sending(
    served: tuple[TestClient, EmbeddedEngine, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, engine, model = served
    publisher = BroadcastPolicyPublisher("http://testserver", TOKEN, http=client, timeout_s=20)
    passes = Passes(monkeypatch)
    try:
        trainer = _trainer(model, publisher)
        await trainer.train(1, progress=False)
        gathers: list[int] = []
        real = trainer.runtime.inference_weights
        monkeypatch.setattr(
            trainer.runtime, "inference_weights", lambda m: (gathers.append(1), real(m))[1]
        )
        _diverge(trainer, float("nan"))
        with pytest.raises(NonFiniteWeightsError) as caught:
            await trainer.train(2, progress=False)
        assert caught.value.names == [NORM]
        message = str(caught.value)
        assert "refused to send policy version 2" in message and "stopped at step 2" in message
        assert gathers == [] and passes.count == 0  # refused before the gather and the publisher
        assert engine.policy_version == 1  # the server kept the last good weights
    finally:
        publisher.close()


async def test_a_narrowing_wire_cast_is_still_checked_after_the_trainers_pass(
    served: tuple[TestClient, EmbeddedEngine, torch.nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, engine, model = served
    publisher = BroadcastPolicyPublisher(
        "http://testserver", TOKEN, http=client, timeout_s=20, wire_dtype=torch.float16
    )
    passes = Passes(monkeypatch)
    try:
        trainer = _trainer(model, publisher)
        _diverge(trainer, 1e6)  # finite in the trainer's float32, inf in the wire's float16
        with pytest.raises(NonFiniteWeightsError, match=rf"version 1: 1 tensor.*\({NORM}\)"):
            await trainer.train(1, progress=False)
        assert passes.count == 1  # only over the tensors the cast narrowed
        assert publisher.fleet.group is None and engine.policy_version == 0  # nothing sent
    finally:
        publisher.close()
