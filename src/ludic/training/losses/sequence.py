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

from ludic.training.algorithm_types import Aggregation, LossOutput
from ludic.training.losses.aggregation import masked_seq_mean
from ludic.training.losses.base import AggregatedLoss, LossBatch, check_clip


def _sequence_metrics(
    batch: LossBatch, ratio_B: torch.Tensor, clipped_BT: torch.Tensor
) -> dict[str, float]:
    """clip_frac (share of action tokens whose term was clipped) and approx_kl (token k3 to
    the behaviour policy) are additive over tokens; ratio_mean is the sequence ratio's additive
    share over sequences; ratio_min / ratio_max are this micro-batch's sequence ratios."""
    log_ratio_BT = batch.log_ratio_BT.detach()
    has_tokens_B = batch.mask_BT.any(dim=-1)
    ratio_B = ratio_B.detach()
    metrics = {
        "clip_frac": batch.share(clipped_BT.float()),
        "approx_kl": batch.share(torch.exp(log_ratio_BT) - 1.0 - log_ratio_BT),
        "ratio_mean": float(ratio_B[has_tokens_B].sum().item()) / batch.total_sequences,
    }
    if bool(has_tokens_B.any()):
        metrics["ratio_min"] = float(ratio_B[has_tokens_B].min().item())
        metrics["ratio_max"] = float(ratio_B[has_tokens_B].max().item())
    return metrics


def _broadcast(values_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    return values_B.unsqueeze(-1).expand(mask_BT.shape)


@dataclass(frozen=True, kw_only=True, slots=True)
class SequenceClippedSurrogateLoss(AggregatedLoss):
    """GSPO (arXiv:2507.18071): PPO's clipped surrogate on the length-normalised sequence ratio

        s_i = exp(mean_t (log pi(a_it) - log mu(a_it)))
        loss = agg(-min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i))

    The paper's clip range is tiny (3e-4, 4e-4) because s_i is a per-token geometric mean.
    Without behaviour logprobs s_i = 1 (on-policy).
    """

    name: ClassVar[str] = "gspo"
    aggregation: Aggregation = "seq_mean_token_mean"
    clip_eps_low: float = 3e-4
    clip_eps_high: float = 4e-4

    def _check_config(self) -> None:
        check_clip(self.clip_eps_low, self.clip_eps_high, "SequenceClippedSurrogateLoss")

    def compute(self, batch: LossBatch) -> LossOutput:
        ratio_B = torch.exp(masked_seq_mean(batch.log_ratio_BT, batch.mask_BT))
        advantages_B = batch.advantages_B1.squeeze(-1)
        unclipped_B = ratio_B * advantages_B
        clipped_B = ratio_B.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high) * advantages_B
        objective_BT = _broadcast(torch.minimum(unclipped_B, clipped_B), batch.mask_BT)
        loss = -self.reduce(batch.corrected(objective_BT), batch)
        is_clipped_BT = _broadcast(clipped_B.detach() < unclipped_B.detach(), batch.mask_BT)
        return LossOutput(loss=loss, metrics=_sequence_metrics(batch, ratio_B, is_clipped_BT))


@dataclass(frozen=True, kw_only=True, slots=True)
class GMPOLoss(AggregatedLoss):
    """GMPO (arXiv:2507.20673): maximise the geometric mean of clipped token ratios,

        J_i = (prod_t min(r_t A_i, clip(r_t, e^-eps_low, e^eps_high) A_i))^(1/|o_i|) * sgn(A_i)
            = A_i * exp(mean_t sgn(A_i) * min(sgn(A_i) log r_t, sgn(A_i) clip(log r_t, -eps_low, eps_high)))
        loss = agg(-J_i)

    computed in log space. Clipping is per token in log space, range (e^-0.4, e^0.4) by
    default. A token counts as clipped when its clipped log ratio was selected (strictly).
    """

    name: ClassVar[str] = "gmpo"
    aggregation: Aggregation = "seq_mean_token_mean"
    clip_eps_low: float = 0.4
    clip_eps_high: float = 0.4

    def _check_config(self) -> None:
        check_clip(self.clip_eps_low, self.clip_eps_high, "GMPOLoss", max_low=None)

    def compute(self, batch: LossBatch) -> LossOutput:
        sign_B1 = torch.sign(batch.advantages_B1)
        signed_BT = sign_B1 * batch.log_ratio_BT
        signed_clamped_BT = sign_B1 * batch.log_ratio_BT.clamp(
            -self.clip_eps_low, self.clip_eps_high
        )
        chosen_BT = sign_B1 * torch.minimum(signed_BT, signed_clamped_BT)
        geo_ratio_B = torch.exp(masked_seq_mean(chosen_BT, batch.mask_BT))
        objective_BT = _broadcast(batch.advantages_B1.squeeze(-1) * geo_ratio_B, batch.mask_BT)
        loss = -self.reduce(batch.corrected(objective_BT), batch)
        is_clipped_BT = signed_clamped_BT.detach() < signed_BT.detach()
        raw_ratio_B = torch.exp(masked_seq_mean(batch.log_ratio_BT.detach(), batch.mask_BT))
        return LossOutput(loss=loss, metrics=_sequence_metrics(batch, raw_ratio_B, is_clipped_BT))
