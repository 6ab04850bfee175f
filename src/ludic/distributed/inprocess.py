"""`InProcessPublisher`: pushes weights into an inference engine living in the same process
(`ludic.inference.EmbeddedEngine`, or anything with its `update_weights` method), then checks
the push took effect. No serialisation or network: tensors are copied in place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from ludic.distributed.interfaces import PublishVerificationError, Weights


class WeightTarget(Protocol):
    """What the publisher needs from an engine (EmbeddedEngine has both methods)."""

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, version: int | None = None
    ) -> int: ...

    def logprobs(self, token_ids: Sequence[int]) -> list[float]: ...


def _reference_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> list[float]:
    param = next(model.parameters())
    ids_1T = torch.tensor([list(token_ids)], device=param.device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            logits_TV = model(input_ids=ids_1T).logits[0, :-1].float()
    finally:
        model.train(was_training)
    lp_T = torch.log_softmax(logits_TV, -1).gather(-1, ids_1T[0, 1:, None]).squeeze(-1)
    return [float(x) for x in lp_T.tolist()]


class InProcessPublisher:
    """Calls `engine.update_weights(state_dict, version=version)` and verifies the result.

    The engine must report back `version` (a silent no-op update is caught). With
    `probe_token_ids` (and weights passed as a model), the engine's logprobs on those tokens
    must match the published model's within `atol`.
    """

    def __init__(
        self,
        engine: WeightTarget,
        *,
        probe_token_ids: Sequence[int] | None = None,
        atol: float = 1e-4,
    ) -> None:
        if probe_token_ids is not None and len(probe_token_ids) < 2:
            raise ValueError("probe_token_ids needs at least 2 tokens (a prefix and a target)")
        self.engine = engine
        self.probe_token_ids = None if probe_token_ids is None else list(probe_token_ids)
        self.atol = atol
        self.num_published = 0

    def publish(self, weights: Weights, *, version: int) -> None:
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        served = self.engine.update_weights(state, version=version)
        if served != version:
            raise PublishVerificationError(
                f"published policy version {version} but the engine reports {served}"
            )
        if self.probe_token_ids is not None and isinstance(weights, torch.nn.Module):
            self._check_probe(weights)
        self.num_published += 1

    def _check_probe(self, model: torch.nn.Module) -> None:
        assert self.probe_token_ids is not None
        expected = _reference_logprobs(model, self.probe_token_ids)
        served = self.engine.logprobs(self.probe_token_ids)
        gap = max(abs(a - b) for a, b in zip(expected, served, strict=True))
        if gap > self.atol:
            raise PublishVerificationError(
                f"after publishing, the engine's logprobs on the probe tokens differ from the "
                f"trainer's by {gap:.3g} (> atol {self.atol}): the weight update did not apply"
            )
