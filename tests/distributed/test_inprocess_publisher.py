"""InProcessPublisher pushes trainer weights into the embedded engine and catches no-op syncs."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import pytest
import torch

from ludic.distributed import InProcessPublisher, PolicyPublisher, PublishVerificationError
from ludic.inference.engine import EmbeddedEngine
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
        after = engine.logprobs(PROBE)
        assert before != after
        for name, tensor in trainer_model.state_dict().items():
            assert torch.equal(served.state_dict()[name], tensor), name
        publisher.publish(trainer_model.state_dict(), version=4)  # a state dict works too
        assert engine.policy_version == 4


class _NoOpEngine:
    """Reports whatever version it is told but never changes its weights."""

    def __init__(self, model: torch.nn.Module, honest_version: bool) -> None:
        self.model = model
        self.honest_version = honest_version

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, version: int | None = None
    ) -> int:
        return version if self.honest_version and version is not None else 0

    def logprobs(self, token_ids: Sequence[int]) -> list[float]:
        ids = torch.tensor([list(token_ids)])
        with torch.no_grad():
            lp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1], -1)
        return lp.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()


def test_silent_noop_sync_is_caught() -> None:
    model, _ = build_tiny_model(seed=0, spec=SPEC)
    stale = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # (adding a constant would leave softmax unchanged)
    with pytest.raises(PublishVerificationError, match="reports 0"):
        InProcessPublisher(_NoOpEngine(stale, honest_version=False)).publish(model, version=2)
    with pytest.raises(PublishVerificationError, match="probe"):
        InProcessPublisher(_NoOpEngine(stale, honest_version=True), probe_token_ids=PROBE).publish(
            model, version=2
        )
    # Without a probe, an engine that reports the right version is trusted.
    InProcessPublisher(_NoOpEngine(stale, honest_version=True)).publish(model, version=2)
