"""Losses that do not use advantages: masked cross-entropy (SFT), KL to a reference model and
an entropy bonus. Combine the last two with a policy loss through `CompositeLoss`, whose
coefficient is beta (KL) or the entropy coefficient; they carry no coefficient themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ludic.training.algorithm_types import Aggregation, LossInputs, LossOutput
from ludic.training.losses.aggregation import (
    action_mask,
    aggregate,
    check_aggregation,
    masked,
    token_share,
)

KLEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(
    logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor, estimator: KLEstimator
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by (approximately) pi, with
    d = log pi_ref(a) - log pi(a) (Schulman, "Approximating KL divergence"):

        k1 = -d                 unbiased, can be negative
        k2 = d^2 / 2            biased, low variance
        k3 = exp(d) - 1 - d     unbiased, >= 0 (GRPO's choice)
    """
    d_BT = ref_logprobs_BT - logprobs_BT
    if estimator == "k1":
        return -d_BT
    if estimator == "k2":
        return 0.5 * d_BT.square()
    if estimator == "k3":
        return torch.exp(d_BT) - 1.0 - d_BT
    raise ValueError(f"kl_estimate: estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class MaskedCrossEntropyLoss:
    """SFT: loss = agg(-log pi(a_t)) over action tokens; advantages are ignored."""

    name: ClassVar[str] = "nll"
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation, self.constant_normalizer, "MaskedCrossEntropyLoss")

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        mask_BT = action_mask(inputs)
        nll_BT = -masked(inputs.logprobs_BT.float(), mask_BT)
        loss = aggregate(
            nll_BT,
            mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        return LossOutput(
            loss=loss, metrics={"nll": token_share(nll_BT, mask_BT, inputs.total_action_tokens)}
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class KLToReferenceLoss:
    """loss = agg(k(log pi, log pi_ref)) with k one of `kl_estimate`'s estimators.

    Needs `ref_logprobs_BT` (the Trainer computes them when `needs_ref_logprobs`). Metric
    `kl_ref` is the token-mean estimate, additive over micro-batches.
    """

    name: ClassVar[str] = "kl_ref"
    estimator: KLEstimator = "k3"
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        if self.estimator not in ("k1", "k2", "k3"):
            raise ValueError(
                f"KLToReferenceLoss: estimator must be 'k1', 'k2' or 'k3', got {self.estimator!r}"
            )
        check_aggregation(self.aggregation, self.constant_normalizer, "KLToReferenceLoss")

    @property
    def needs_ref_logprobs(self) -> bool:
        return True

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        mask_BT = action_mask(inputs)
        if inputs.ref_logprobs_BT is None:
            raise ValueError(
                "KLToReferenceLoss needs LossInputs.ref_logprobs_BT; give the Trainer a reference "
                "model (it computes them when loss.needs_ref_logprobs is True)"
            )
        logprobs_BT = masked(inputs.logprobs_BT.float(), mask_BT)
        ref_BT = masked(inputs.ref_logprobs_BT.detach().float(), mask_BT)
        kl_BT = kl_estimate(logprobs_BT, ref_BT, self.estimator)
        loss = aggregate(
            kl_BT,
            mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        return LossOutput(
            loss=loss, metrics={"kl_ref": token_share(kl_BT, mask_BT, inputs.total_action_tokens)}
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class EntropyBonus:
    """loss = -agg(H_t): minimising it raises the policy's token entropy.

    Needs `entropy_BT` (the Trainer computes it when `needs_entropy`). Metric `entropy` is the
    token-mean entropy, additive over micro-batches.
    """

    name: ClassVar[str] = "entropy"
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation, self.constant_normalizer, "EntropyBonus")

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return True

    def __call__(self, inputs: LossInputs) -> LossOutput:
        mask_BT = action_mask(inputs)
        if inputs.entropy_BT is None:
            raise ValueError(
                "EntropyBonus needs LossInputs.entropy_BT; the Trainer computes it when "
                "loss.needs_entropy is True"
            )
        entropy_BT = masked(inputs.entropy_BT.float(), mask_BT)
        loss = -aggregate(
            entropy_BT,
            mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        return LossOutput(
            loss=loss,
            metrics={"entropy": token_share(entropy_BT, mask_BT, inputs.total_action_tokens)},
        )
