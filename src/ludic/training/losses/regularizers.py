"""Losses that do not use advantages: masked cross-entropy (SFT), KL to a reference model and
an entropy bonus. Combine the last two with a policy loss through `CompositeLoss`, whose
coefficient is beta (KL) or the entropy coefficient; they carry no coefficient themselves.
They ignore rollout-correction weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ludic.training.algorithm_types import LossOutput
from ludic.training.losses.base import AggregatedLoss, LossBatch

KLEstimator = Literal["k1", "k2", "k3", "abs", "k1+", "k3+"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "abs", "k1+", "k3+")
# exp(d) of k3 is taken on d clamped to +-K3_LOG_RATIO_LIMIT when k3 is clamped (as verl's
# low_var_kl), so a far-off reference cannot overflow before the value clamp.
K3_LOG_RATIO_LIMIT = 20.0


def check_kl_options(estimator: str, clamp: float | None, owner: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"{owner}: estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if clamp is not None:
        if estimator not in ("k3", "k3+"):
            raise ValueError(f"{owner}: clamp applies to 'k3' / 'k3+' only, got {estimator!r}")
        if not clamp > 0:
            raise ValueError(f"{owner}: clamp must be > 0 (verl uses 10), got {clamp}")


def kl_estimate(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    estimator: KLEstimator,
    *,
    clamp: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled by (approximately) pi, with
    d = log pi_ref(a) - log pi(a) (Schulman, "Approximating KL divergence"):

        k1  = -d                 unbiased, can be negative
        k2  = d^2 / 2            biased, low variance
        k3  = exp(d) - 1 - d     unbiased, >= 0 (GRPO's choice); with `clamp=c`,
                                 min(k3(clamp(d, +-20)), c) (verl's low_var_kl, c = 10)
        abs = |d|
        k1+, k3+ (straight-through): the value of k1 / k3, the gradient of k2,
                 k2 - sg(k2) + sg(k), since grad k2 = -d grad log pi is the unbiased
                 gradient of KL(pi || pi_ref) on on-policy samples (verl's "k1+" / "k3+").
    """
    check_kl_options(estimator, clamp, "kl_estimate")
    d_BT = ref_logprobs_BT - logprobs_BT
    if estimator.endswith("+"):
        value_BT = kl_estimate(logprobs_BT, ref_logprobs_BT, estimator[:-1], clamp=clamp)  # type: ignore[arg-type]
        k2_BT = 0.5 * d_BT.square()
        return k2_BT - k2_BT.detach() + value_BT.detach()
    if estimator == "k1":
        return -d_BT
    if estimator == "k2":
        return 0.5 * d_BT.square()
    if estimator == "abs":
        return d_BT.abs()
    if clamp is None:
        return torch.exp(d_BT) - 1.0 - d_BT
    d_BT = d_BT.clamp(-K3_LOG_RATIO_LIMIT, K3_LOG_RATIO_LIMIT)
    return (torch.exp(d_BT) - 1.0 - d_BT).clamp(max=clamp)


@dataclass(frozen=True, kw_only=True, slots=True)
class MaskedCrossEntropyLoss(AggregatedLoss):
    """SFT: loss = agg(-log pi(a_t)) over action tokens; advantages are ignored."""

    name: ClassVar[str] = "nll"

    def compute(self, batch: LossBatch) -> LossOutput:
        nll_BT = -batch.logprobs_BT
        return LossOutput(loss=self.reduce(nll_BT, batch), metrics={"nll": batch.share(nll_BT)})


@dataclass(frozen=True, kw_only=True, slots=True)
class KLToReferenceLoss(AggregatedLoss):
    """loss = agg(k(log pi, log pi_ref)) with k one of `kl_estimate`'s estimators (`clamp`
    caps k3 / k3+, see `kl_estimate`).

    Needs `ref_logprobs_BT` (the Trainer computes them when `needs_ref_logprobs`). Metric
    `kl_ref` is the token-mean estimate, additive over micro-batches.
    """

    name: ClassVar[str] = "kl_ref"
    needs_ref_logprobs: ClassVar[bool] = True
    estimator: KLEstimator = "k3"
    clamp: float | None = None

    def _check_config(self) -> None:
        check_kl_options(self.estimator, self.clamp, "KLToReferenceLoss")

    def compute(self, batch: LossBatch) -> LossOutput:
        assert batch.ref_logprobs_BT is not None  # __call__ refuses a batch without them
        kl_BT = kl_estimate(
            batch.logprobs_BT, batch.ref_logprobs_BT, self.estimator, clamp=self.clamp
        )
        return LossOutput(loss=self.reduce(kl_BT, batch), metrics={"kl_ref": batch.share(kl_BT)})


@dataclass(frozen=True, kw_only=True, slots=True)
class EntropyBonus(AggregatedLoss):
    """loss = -agg(H_t): minimising it raises the policy's token entropy.

    H_t is the entropy of the distribution token t was sampled from (softmax(logits / T) on its
    top-k / top-p support: `ludic.training.logprobs`), the one the ratio's logprobs are of.
    Needs `entropy_BT` (the Trainer computes it when `needs_entropy`). Metric `entropy` is the
    token-mean entropy, additive over micro-batches.
    """

    name: ClassVar[str] = "entropy"
    needs_entropy: ClassVar[bool] = True

    def compute(self, batch: LossBatch) -> LossOutput:
        assert batch.entropy_BT is not None  # __call__ refuses a batch without it
        entropy_BT = batch.entropy_BT
        return LossOutput(
            loss=-self.reduce(entropy_BT, batch), metrics={"entropy": batch.share(entropy_BT)}
        )
