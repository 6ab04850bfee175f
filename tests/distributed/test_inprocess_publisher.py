"""InProcessPublisher pushes trainer weights into the embedded engine, and its verification
cannot be fooled: an engine that reports the version but never loads, one that skips one
tensor, one that drops a tiny update, and nan or inf logprobs each fail the publish."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from ludic.distributed import InProcessPublisher, PolicyPublisher, PublishVerificationError
from ludic.inference import NonFiniteWeightsError
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import TinyModelSpec, build_tiny_model

SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    tokenizer_vocab_size=300,
)
PROBE = [5, 17, 42, 99, 3]


def test_publish_updates_engine_weights_and_version() -> None:
    trainer_model, tokenizer = build_tiny_model(seed=0, spec=SPEC)
    served = copy.deepcopy(trainer_model)
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(0.05)  # the trainer has moved on
    with EmbeddedEngine(served, tokenizer) as engine:
        publisher = InProcessPublisher(engine, probe_token_ids=PROBE)
        assert isinstance(publisher, PolicyPublisher)
        before = engine.logprobs(PROBE)
        publisher.publish(trainer_model, version=3)
        assert engine.policy_version == 3 and publisher.num_published == 1
        assert before != engine.logprobs(PROBE)
        for name, tensor in trainer_model.state_dict().items():
            assert torch.equal(served.state_dict()[name], tensor), name
        publisher.publish(trainer_model.state_dict(), version=4)  # a state dict works too
        assert engine.policy_version == 4


class SabotagedEngine:
    """An EmbeddedEngine-like target over a real model that misbehaves on purpose.

    `mode`: "no_load" (reports the version, loads nothing), "skip_norm" (loads all but the
    final norm), "drop_small" (loads only tensors that moved by more than 1e-5), "nan" or "inf"
    (loads correctly, but the forward returns a non-finite logprob at one position)."""

    def __init__(self, model: torch.nn.Module, mode: str) -> None:
        self.model = model
        self.mode = mode

    def update_weights(self, weights: Mapping[str, torch.Tensor], *, version: int | None) -> int:
        live = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights.items():
                if self.mode == "no_load":
                    continue
                if self.mode == "skip_norm" and name == "model.norm.weight":
                    continue
                if self.mode == "drop_small" and (tensor - live[name]).abs().max() <= 1e-5:
                    continue
                live[name].copy_(tensor)
        assert version is not None
        return version

    def logprobs(self, token_ids: Sequence[int]) -> list[float]:
        ids = torch.tensor([list(token_ids)])
        with torch.no_grad():
            lp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1], -1)
        values: list[float] = lp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
        if self.mode in ("nan", "inf"):
            values[2] = math.nan if self.mode == "nan" else -math.inf
        return values


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    trainer_model, _ = build_tiny_model(seed=0, spec=SPEC)
    return trainer_model, copy.deepcopy(trainer_model)


def _adam_step(model: torch.nn.Module, lr: float) -> None:
    """One real optimizer step: every parameter moves by about `lr`."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    ids = torch.tensor([PROBE])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()


def _publish(engine: SabotagedEngine, model: torch.nn.Module, **kwargs: Any) -> None:
    InProcessPublisher(engine, probe_token_ids=PROBE, **kwargs).publish(model, version=2)


def test_an_engine_that_reports_the_version_but_never_loads_is_caught() -> None:
    trainer_model, served = _pair()
    _adam_step(trainer_model, lr=1e-2)
    with pytest.raises(PublishVerificationError, match="differ from the ones sent") as info:
        _publish(SabotagedEngine(served, "no_load"), trainer_model)
    assert "reports policy version" not in str(info.value)  # the version was right


def test_an_engine_that_skips_the_final_norm_is_caught() -> None:
    trainer_model, served = _pair()
    _adam_step(trainer_model, lr=1e-2)
    with pytest.raises(PublishVerificationError, match=r"1 tensors .*\[model\.norm\.weight\]"):
        _publish(SabotagedEngine(served, "skip_norm"), trainer_model)


def test_an_engine_that_drops_a_tiny_adam_step_is_caught() -> None:
    trainer_model, served = _pair()
    _adam_step(trainer_model, lr=1e-6)
    engine = SabotagedEngine(served, "drop_small")
    # A probe at a server's tolerance (1e-3) cannot see a 1e-6 step: logprobs barely move.
    assert torch.allclose(
        torch.tensor(engine.logprobs(PROBE)),
        torch.tensor(SabotagedEngine(trainer_model, "none").logprobs(PROBE)),
        atol=1e-3,
    )
    with pytest.raises(PublishVerificationError, match="differ from the ones sent") as info:
        _publish(engine, trainer_model, atol=1e-3)
    assert "probe logprobs differ" not in str(info.value)  # the checksums caught it


@pytest.mark.parametrize("mode", ["nan", "inf"])
def test_non_finite_served_logprobs_fail(mode: str) -> None:
    trainer_model, served = _pair()
    _adam_step(trainer_model, lr=1e-2)
    # Even a tolerance that lets any finite gap through does not let nan or inf through.
    with pytest.raises(PublishVerificationError, match=r"server's probe logprobs are not finite"):
        _publish(SabotagedEngine(served, mode), trainer_model, atol=1e9)


def test_non_finite_published_weights_are_refused_on_every_push() -> None:
    trainer_model, served = _pair()
    publisher = InProcessPublisher(SabotagedEngine(served, "none"), probe_token_ids=PROBE)
    publisher.publish(trainer_model, version=1)  # probed
    with torch.no_grad():
        trainer_model.model.norm.weight[0] = math.nan
    # The second push is not probed (probe_every=10): it is still refused, naming the tensor,
    # before the engine gets anything.
    with pytest.raises(NonFiniteWeightsError, match=r"nan or inf \(model\.norm\.weight\)"):
        publisher.publish(trainer_model, version=2)
    assert bool(torch.isfinite(served.model.norm.weight).all())


def test_the_probe_runs_on_the_first_push_and_every_nth() -> None:
    trainer_model, served = _pair()
    engine = SabotagedEngine(served, "none")
    calls = []
    logprobs = engine.logprobs
    engine.logprobs = lambda ids: calls.append(1) or logprobs(ids)  # type: ignore[method-assign]
    publisher = InProcessPublisher(engine, probe_token_ids=PROBE, probe_every=3)
    for version in range(1, 8):
        publisher.publish(trainer_model, version=version)
    assert len(calls) == 3  # pushes 1, 4 and 7
    with pytest.raises(ValueError, match="probe_every"):
        InProcessPublisher(engine, probe_every=0)


def test_a_wrong_version_is_caught() -> None:
    trainer_model, served = _pair()

    class WrongVersion(SabotagedEngine):
        def update_weights(
            self, weights: Mapping[str, torch.Tensor], *, version: int | None
        ) -> int:
            super().update_weights(weights, version=version)
            return 0

    with pytest.raises(PublishVerificationError, match="reports policy version 0, expected 2"):
        _publish(WrongVersion(served, "none"), trainer_model)


def test_an_honest_engine_passes_and_an_unreadable_one_is_refused() -> None:
    trainer_model, served = _pair()
    _adam_step(trainer_model, lr=1e-6)
    _publish(SabotagedEngine(served, "none"), trainer_model)  # the tiny step arrived whole
    with pytest.raises(ValueError, match="has no `model`"):
        InProcessPublisher(object())  # type: ignore[arg-type]
    InProcessPublisher(object(), verify=False)  # type: ignore[arg-type]
