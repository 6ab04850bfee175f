"""Sequence-level ratio losses: GSPO (clipped sequence ratio) and GMPO (geometric mean of
token ratios, clipped per token in log space).

Both compute one objective per sequence and broadcast it to the sequence's action tokens before
the shared aggregation, so under seq_mean_token_mean (their papers' default) each sequence counts
once. Neither implements GSPO-token or GMPO variants with per-token advantages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ludic.training.algorithm_types import Aggregation, LossInputs, LossOutput
from ludic.training.losses._common import PolicyTerms, corrected, policy_terms
from ludic.training.losses.aggregation import (
    aggregate,
    check_aggregation,
    masked_seq_mean,
    token_share,
)


def _sequence_metrics(
    terms: PolicyTerms, ratio_B: torch.Tensor, clipped_BT: torch.Tensor, inputs: LossInputs
) -> dict[str, float]:
    """clip_frac (share of action tokens whose term was clipped) and approx_kl (token k3 to
    the behaviour policy) are additive over tokens; ratio_mean is the sequence ratio's additive
    share over sequences; ratio_min / ratio_max are this micro-batch's sequence ratios."""
    mask_BT = terms.mask_BT
    log_ratio_BT = terms.log_ratio_BT.detach()
    k3_BT = torch.exp(log_ratio_BT) - 1.0 - log_ratio_BT
    has_tokens_B = mask_BT.any(dim=-1)
    ratio_B = ratio_B.detach()
    metrics = {
        "clip_frac": token_share(clipped_BT.float(), mask_BT, inputs.total_action_tokens),
        "approx_kl": token_share(k3_BT, mask_BT, inputs.total_action_tokens),
        "ratio_mean": float(ratio_B[has_tokens_B].sum().item()) / inputs.total_sequences,
    }
    if bool(has_tokens_B.any()):
        metrics["ratio_min"] = float(ratio_B[has_tokens_B].min().item())
        metrics["ratio_max"] = float(ratio_B[has_tokens_B].max().item())
    return metrics


def _broadcast(values_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return values_B.unsqueeze(-1).expand(mask_BT.shape)


@dataclass(frozen=True, kw_only=True, slots=True)
class SequenceClippedSurrogateLoss:
    """GSPO (arXiv:2507.18071): PPO's clipped surrogate on the length-normalised sequence ratio

        s_i = exp(mean_t (log pi(a_it) - log mu(a_it)))
        loss = agg(-min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i))

    The paper's clip range is tiny (3e-4, 4e-4) because s_i is a per-token geometric mean.
    Without behaviour logprobs s_i = 1 (on-policy).
    """

    name: ClassVar[str] = "gspo"
    clip_eps_low: float = 3e-4
    clip_eps_high: float = 4e-4
    aggregation: Aggregation = "seq_mean_token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.clip_eps_low <= 1.0 and self.clip_eps_high >= 0.0):
            raise ValueError(
                "SequenceClippedSurrogateLoss: need 0 <= clip_eps_low <= 1 and clip_eps_high >= 0, "
                f"got {self.clip_eps_low}, {self.clip_eps_high}"
            )
        check_aggregation(
            self.aggregation, self.constant_normalizer, "SequenceClippedSurrogateLoss"
        )

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        terms = policy_terms(inputs)
        ratio_B = torch.exp(masked_seq_mean(terms.log_ratio_BT, terms.mask_BT))
        advantages_B = terms.advantages_B1.squeeze(-1)
        unclipped_B = ratio_B * advantages_B
        clipped_B = ratio_B.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high) * advantages_B
        loss = -aggregate(
            corrected(_broadcast(torch.minimum(unclipped_B, clipped_B), terms.mask_BT), terms),
            terms.mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        is_clipped_BT = _broadcast(clipped_B.detach() < unclipped_B.detach(), terms.mask_BT)
        return LossOutput(
            loss=loss, metrics=_sequence_metrics(terms, ratio_B, is_clipped_BT, inputs)
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class GMPOLoss:
    """GMPO (arXiv:2507.20673): maximise the geometric mean of clipped token ratios,

        J_i = (prod_t min(r_t A_i, clip(r_t, e^-eps_low, e^eps_high) A_i))^(1/|o_i|) * sgn(A_i)
            = A_i * exp(mean_t sgn(A_i) * min(sgn(A_i) log r_t, sgn(A_i) clip(log r_t, -eps_low, eps_high)))
        loss = agg(-J_i)

    computed in log space. Clipping is per token in log space, range (e^-0.4, e^0.4) by
    default. A token counts as clipped when its clipped log ratio was selected (strictly).
    """

    name: ClassVar[str] = "gmpo"
    clip_eps_low: float = 0.4
    clip_eps_high: float = 0.4
    aggregation: Aggregation = "seq_mean_token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        if not (self.clip_eps_low >= 0.0 and self.clip_eps_high >= 0.0):
            raise ValueError(
                f"GMPOLoss: clip epsilons must be >= 0, got {self.clip_eps_low}, {self.clip_eps_high}"
            )
        check_aggregation(self.aggregation, self.constant_normalizer, "GMPOLoss")

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        terms = policy_terms(inputs)
        sign_B1 = torch.sign(terms.advantages_B1)
        signed_BT = sign_B1 * terms.log_ratio_BT
        signed_clamped_BT = sign_B1 * terms.log_ratio_BT.clamp(
            -self.clip_eps_low, self.clip_eps_high
        )
        chosen_BT = sign_B1 * torch.minimum(signed_BT, signed_clamped_BT)
        geo_ratio_B = torch.exp(masked_seq_mean(chosen_BT, terms.mask_BT))
        objective_B = terms.advantages_B1.squeeze(-1) * geo_ratio_B
        loss = -aggregate(
            corrected(_broadcast(objective_B, terms.mask_BT), terms),
            terms.mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        is_clipped_BT = signed_clamped_BT.detach() < signed_BT.detach()
        raw_ratio_B = torch.exp(masked_seq_mean(terms.log_ratio_BT.detach(), terms.mask_BT))
        return LossOutput(
            loss=loss, metrics=_sequence_metrics(terms, raw_ratio_B, is_clipped_BT, inputs)
        )
