"""Train/inference mismatch and policy lag, measured on every step.

`mismatch_metrics` compares the behaviour logprobs a sample arrived with against the trainer's
recomputation under the same sampling transform: for an on-policy sample with identical
numerics the log ratio is exactly 0; kernels, dtypes (bf16 on vLLM) and policy lag make it
drift. `policy_lag_metrics` counts samples by how many updates old their oldest token is. Both
only measure: the corrections are loss options (`losses.rollout_correction`).

Shape legend: B = sequences, T = padded tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ludic.rollouts.samples import SAWItem

# |log pi - log mu| beyond this counts in `mismatch/frac_beyond`: a ratio outside about
# [0.82, 1.22], the band where PPO's default clip (0.2) starts to act.
MISMATCH_LOG_RATIO_THRESHOLD = 0.2
LAG_BUCKETS = 3  # lag 0, 1, 2 and "3+"


def mismatch_metrics(
    logprobs_BT: torch.Tensor,
    behavior_logprobs_BT: torch.Tensor,
    action_mask_BT: torch.Tensor,
    *,
    total_action_tokens: float,
    threshold: float = MISMATCH_LOG_RATIO_THRESHOLD,
) -> dict[str, float]:
    """Per-token log ratio d = log pi(a) - log mu(a) over action tokens (pi the trainer, mu the
    behaviour policy), as additive shares of the batch's action tokens, so micro-batches (and
    ranks) combine by summing, except `_max`, combined by max (`reduce_metrics`):

        mismatch/k3                  mean(exp(d) - 1 - d), the k3 estimate of KL(mu || pi)
        mismatch/abs_log_ratio_mean  mean |d|
        mismatch/abs_log_ratio_max   max |d| (this micro-batch's)
        mismatch/frac_beyond         share of tokens with |d| > threshold
        mismatch/tokens              share of action tokens measured (1.0 when all have mu)

    Empty when the micro-batch has no action token.
    """
    mask_BT = action_mask_BT > 0
    if not bool(mask_BT.any()):
        return {}
    d_R = (logprobs_BT.detach().double() - behavior_logprobs_BT.detach().double())[mask_BT]
    finite_R = torch.isfinite(d_R)
    d_R = torch.where(finite_R, d_R, torch.full_like(d_R, float("inf")))
    k3_R = torch.where(finite_R, torch.expm1(d_R.clamp(max=50.0)) - d_R, d_R)
    abs_R = d_R.abs()
    total = float(total_action_tokens)
    return {
        "mismatch/k3": float(k3_R.sum().item()) / total,
        "mismatch/abs_log_ratio_mean": float(abs_R.sum().item()) / total,
        "mismatch/abs_log_ratio_max": float(abs_R.max().item()),
        "mismatch/frac_beyond": float((abs_R > threshold).sum().item()) / total,
        "mismatch/tokens": float(d_R.numel()) / total,
    }


def policy_lag_metrics(
    current_version: int,
    items: Sequence[SAWItem],
    *,
    position: Callable[[int], int] | None = None,
) -> dict[str, float]:
    """Histogram of lag = `current_version` - oldest policy version of each sample's tokens:
    `policy_lag/0`, `/1`, `/2`, `/3+` count samples, `policy_lag/unknown` those without a
    recorded version, `policy_lag/ahead` those newer than the trainer (a version mix-up), and
    `policy_lag/mean` and `/max` summarise the lags >= 0. `position` maps a version to its
    count of updates where version numbers skip (`Trainer.version_position`)."""
    if position is not None:
        current_version = position(current_version)
    counts = dict.fromkeys(["0", "1", "2", f"{LAG_BUCKETS}+", "unknown", "ahead"], 0.0)
    lags: list[int] = []
    for item in items:
        versions = item.policy_versions
        if not versions:
            counts["unknown"] += 1
            continue
        oldest = min(versions)
        lag = current_version - (oldest if position is None else position(oldest))
        if lag < 0:  # a sample from a newer policy than the trainer's: a version mix-up
            counts["ahead"] += 1
            continue
        lags.append(lag)
        counts[str(lag) if lag < LAG_BUCKETS else f"{LAG_BUCKETS}+"] += 1
    metrics = {f"policy_lag/{k}": v for k, v in counts.items()}
    if lags:
        metrics["policy_lag/mean"] = sum(lags) / len(lags)
        metrics["policy_lag/max"] = float(max(lags))
    return metrics


__all__ = [
    "LAG_BUCKETS",
    "MISMATCH_LOG_RATIO_THRESHOLD",
    "mismatch_metrics",
    "policy_lag_metrics",
]
