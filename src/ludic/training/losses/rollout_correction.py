"""Rollout importance-sampling correction: reweight (truncated IS) or reject (mask) tokens and
sequences whose behaviour policy mu differs from the policy the trainer holds.

    rho_t = pi_old(a_t) / mu(a_t)

with mu the behaviour logprobs (what the inference engine sampled from: policy lag, bf16
kernels) and pi_old the trainer's own recomputation at this step, detached. Ludic takes one
optimizer step per batch, so pi_old = sg(pi). The wrapped loss is then computed against
pi_old instead of mu (its ratio r_t = pi / sg(pi) is 1 in value and carries pi's gradient),
and each token's term is multiplied by the product of the corrections' weights:

    TruncatedIS(cap):       w = min(rho, cap)                (TIS)
    RejectOutside(low, high): w = 1 if low <= rho <= high else 0   (masked IS, rejection)

at `level` "token" (rho_t per token), "sequence" (rho_i = prod_t rho_t, the sequence's
likelihood ratio) or "geometric" (exp(mean_t log rho_t), GSPO-style). Rejected tokens still
count in the aggregation's normaliser, so the loss scale does not jump with the rejection
rate. Regularisers (KL, entropy) are not reweighted. This module does not measure the
mismatch (`training.mismatch` does, on every step) and never changes the behaviour logprobs.

Shape legend: B = sequences, T = padded tokens.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, runtime_checkable

import torch

from ludic.training.algorithm_types import Loss, LossInputs, LossOutput
from ludic.training.losses.aggregation import masked, masked_seq_mean
from ludic.training.losses.base import prepare

Level = Literal["token", "sequence", "geometric"]
LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")


def level_log_rho(log_rho_BT: torch.Tensor, mask_BT: torch.Tensor, level: Level) -> torch.Tensor:
    """log rho at `level`, broadcast to every token of its sequence (0 on masked tokens)."""
    if level == "token":
        return masked(log_rho_BT, mask_BT)
    if level == "sequence":
        per_seq_B = masked(log_rho_BT, mask_BT).sum(dim=-1)
    elif level == "geometric":
        per_seq_B = masked_seq_mean(log_rho_BT, mask_BT)
    else:
        raise ValueError(f"rollout correction level must be one of {LEVELS}, got {level!r}")
    return masked(per_seq_B.unsqueeze(-1).expand(mask_BT.shape), mask_BT)


@runtime_checkable
class Correction(Protocol):
    """One correction: per-token weights from log rho, and which tokens it changed."""

    @property
    def label(self) -> str: ...

    def weights(
        self, log_rho_BT: torch.Tensor, mask_BT: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _check_level(level: str, owner: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"{owner}: level must be one of {LEVELS}, got {level!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TruncatedIS:
    """w = min(rho, cap) at `level`; `cap` >= 1 so that an on-policy token keeps weight 1."""

    level: Level = "token"
    cap: float = 2.0

    def __post_init__(self) -> None:
        _check_level(self.level, "TruncatedIS")
        if not (math.isfinite(self.cap) and self.cap >= 1.0):
            raise ValueError(
                f"TruncatedIS: cap must be a finite number >= 1 (weights are min(rho, cap); a "
                f"cap below 1 would down-weight on-policy tokens), got {self.cap}"
            )

    @property
    def label(self) -> str:
        return f"tis_{self.level}"

    def weights(
        self, log_rho_BT: torch.Tensor, mask_BT: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        log_cap = math.log(self.cap)
        at_level_BT = level_log_rho(log_rho_BT, mask_BT, self.level)
        return torch.exp(at_level_BT.clamp(max=log_cap)), at_level_BT > log_cap


@dataclass(frozen=True, kw_only=True, slots=True)
class RejectOutside:
    """w = 1 where low <= rho <= high at `level`, else 0 (the token or sequence is rejected).
    Needs 0 <= low <= 1 <= high, so that an on-policy token is always kept."""

    level: Level = "token"
    low: float = 0.5
    high: float = 2.0

    def __post_init__(self) -> None:
        _check_level(self.level, "RejectOutside")
        if not (0.0 <= self.low <= 1.0 <= self.high):
            raise ValueError(
                f"RejectOutside: need 0 <= low <= 1 <= high (the band must contain ratio 1), "
                f"got low={self.low}, high={self.high}"
            )

    @property
    def label(self) -> str:
        return f"reject_{self.level}"

    def weights(
        self, log_rho_BT: torch.Tensor, mask_BT: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        at_level_BT = level_log_rho(log_rho_BT, mask_BT, self.level)
        log_low = math.log(self.low) if self.low > 0 else -math.inf
        log_high = math.log(self.high) if math.isfinite(self.high) else math.inf
        rejected_BT = (at_level_BT < log_low) | (at_level_BT > log_high)
        return (~rejected_BT).to(log_rho_BT.dtype), rejected_BT


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutCorrection:
    """`loss` with rollout IS correction (see the module docstring for the formula).

    Metrics: the wrapped loss's (its ratio is now against pi_old), plus, as additive shares of
    the batch's action tokens, `rollout_is/weight_mean` (mean correction weight) and
    `rollout_is/<label>_frac` (share of tokens each correction truncated or rejected).
    """

    name: ClassVar[str] = "rollout_is"
    loss: Loss
    corrections: Sequence[Correction]

    def __post_init__(self) -> None:
        corrections = tuple(self.corrections)
        if not corrections:
            raise ValueError(
                "RolloutCorrection needs at least one correction, e.g. TruncatedIS(cap=2.0) "
                "or RejectOutside(low=0.5, high=2.0)"
            )
        for c in corrections:
            if not isinstance(c, Correction):
                raise TypeError(f"RolloutCorrection: {c!r} is not a Correction")
        object.__setattr__(self, "corrections", corrections)

    @property
    def needs_ref_logprobs(self) -> bool:
        return self.loss.needs_ref_logprobs

    @property
    def needs_entropy(self) -> bool:
        return self.loss.needs_entropy

    def __call__(self, inputs: LossInputs) -> LossOutput:
        if inputs.behavior_logprobs_BT is None:
            raise ValueError(
                "RolloutCorrection needs behaviour logprobs (the batch has none); collect "
                "rollouts from a backend that returns logprobs, or drop the correction"
            )
        batch = prepare(inputs)
        mask_BT = batch.mask_BT
        log_rho_BT = batch.log_ratio_BT.detach()  # pi_old = sg(pi): the same clamped log ratio
        weights_BT = torch.ones_like(log_rho_BT)
        metrics: dict[str, float] = {}
        for correction in self.corrections:
            w_BT, changed_BT = correction.weights(log_rho_BT, mask_BT)
            weights_BT = weights_BT * w_BT
            key = f"rollout_is/{correction.label}_frac"
            metrics[key] = metrics.get(key, 0.0) + batch.share(changed_BT.float())
        if batch.is_weights_BT is not None:  # nested corrections multiply
            weights_BT = weights_BT * batch.is_weights_BT
        metrics["rollout_is/weight_mean"] = batch.share(weights_BT)
        out = self.loss(
            dataclasses.replace(
                inputs,
                behavior_logprobs_BT=inputs.logprobs_BT.detach(),
                is_weights_BT=masked(weights_BT, mask_BT),
            )
        )
        return LossOutput(loss=out.loss, metrics={**out.metrics, **metrics})


__all__ = [
    "LEVELS",
    "Correction",
    "Level",
    "RejectOutside",
    "RolloutCorrection",
    "TruncatedIS",
    "level_log_rho",
]
