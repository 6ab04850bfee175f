"""A weighted sum of loss terms: loss = sum_k c_k * loss_k, e.g. a policy loss plus
beta * KL-to-reference plus an entropy bonus. It does not reweight or rescale terms itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ludic.training.algorithm_types import Loss, LossInputs, LossOutput


def _term_names(losses: Sequence[Loss]) -> tuple[str, ...]:
    """Each term's metric prefix: its class's `name` (else the class name); repeats get #2, #3."""
    names: list[str] = []
    for loss in losses:
        base = str(getattr(type(loss), "name", type(loss).__name__))
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return tuple(names)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompositeLoss:
    """loss = sum_k coef_k * term_k(inputs). Metrics are each term's, prefixed `<name>/`, plus
    `<name>/loss` (the unscaled term value, additive over micro-batches)."""

    terms: Sequence[tuple[float, Loss]]

    def __post_init__(self) -> None:
        terms = tuple((float(coef), loss) for coef, loss in self.terms)
        if not terms:
            raise ValueError("CompositeLoss needs at least one (coefficient, loss) term")
        for _, loss in terms:
            if not isinstance(loss, Loss):
                raise TypeError(f"CompositeLoss: {loss!r} does not implement the Loss protocol")
        object.__setattr__(self, "terms", terms)

    @property
    def needs_ref_logprobs(self) -> bool:
        return any(loss.needs_ref_logprobs for _, loss in self.terms)

    @property
    def needs_entropy(self) -> bool:
        return any(loss.needs_entropy for _, loss in self.terms)

    def __call__(self, inputs: LossInputs) -> LossOutput:
        names = _term_names([loss for _, loss in self.terms])
        total: torch.Tensor | None = None
        metrics: dict[str, float] = {}
        for name, (coef, loss) in zip(names, self.terms, strict=True):
            out = loss(inputs)
            total = coef * out.loss if total is None else total + coef * out.loss
            metrics[f"{name}/loss"] = float(out.loss.detach().item())
            metrics.update({f"{name}/{key}": value for key, value in out.metrics.items()})
        assert total is not None  # __post_init__ refuses an empty composite
        return LossOutput(loss=total, metrics=metrics)
