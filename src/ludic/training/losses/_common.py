"""Shared preparation for policy losses: masked float32 logprobs, the log importance ratio
against the behaviour policy, detached advantages, and the ratio metrics every policy loss logs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ludic.training.algorithm_types import LossInputs
from ludic.training.losses.aggregation import action_mask, masked, ratio_extremes, token_share

# |log pi - log mu| is clamped here before any exp: e^20 ~ 5e8 is already meaningless as a ratio,
# and a stale or mismatched behaviour logprob (say -1e4) must not overflow to inf and turn the
# backward pass into nan (0 * inf). Tokens beyond the limit get no gradient through the ratio.
LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyTerms:
    """`log_ratio_BT` = log pi(a) - log mu(a), clamped to +-LOG_RATIO_LIMIT (0 on masked
    tokens; mu := detached pi when the batch has no behaviour logprobs, so the ratio is 1 with
    pi's gradient). `is_weights_BT` are the rollout-correction weights (None: 1)."""

    mask_BT: torch.Tensor
    logprobs_BT: torch.Tensor
    log_ratio_BT: torch.Tensor
    advantages_B1: torch.Tensor
    is_weights_BT: torch.Tensor | None = None


def corrected(values_BT: torch.Tensor, terms: PolicyTerms) -> torch.Tensor:
    """Per-token policy terms times the rollout-correction weights (unchanged without)."""
    if terms.is_weights_BT is None:
        return values_BT
    return values_BT * terms.is_weights_BT


def policy_terms(inputs: LossInputs) -> PolicyTerms:
    mask_BT = action_mask(inputs)
    logprobs_BT = masked(inputs.logprobs_BT.float(), mask_BT)
    if inputs.behavior_logprobs_BT is None:
        behavior_BT = logprobs_BT.detach()
    else:
        behavior_BT = masked(inputs.behavior_logprobs_BT.detach().float(), mask_BT)
    return PolicyTerms(
        mask_BT=mask_BT,
        logprobs_BT=logprobs_BT,
        log_ratio_BT=(logprobs_BT - behavior_BT).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT),
        advantages_B1=inputs.advantages_B.detach().float().unsqueeze(-1),
        is_weights_BT=(
            None if inputs.is_weights_BT is None else inputs.is_weights_BT.detach().float()
        ),
    )


def token_ratio_metrics(
    terms: PolicyTerms, clipped_BT: torch.Tensor, total_action_tokens: float
) -> dict[str, float]:
    """clip_frac, ratio_mean, approx_kl (k3 estimate of KL(mu || pi): r - 1 - log r) are
    additive shares over the batch's action tokens; ratio_min / ratio_max are this
    micro-batch's."""
    log_ratio_BT = terms.log_ratio_BT.detach()
    ratio_BT = torch.exp(log_ratio_BT)
    mask_BT = terms.mask_BT
    return {
        "clip_frac": token_share(clipped_BT.float(), mask_BT, total_action_tokens),
        "ratio_mean": token_share(ratio_BT, mask_BT, total_action_tokens),
        "approx_kl": token_share(ratio_BT - 1.0 - log_ratio_BT, mask_BT, total_action_tokens),
        **ratio_extremes(ratio_BT, mask_BT),
    }
