"""The one aggregation contract every loss uses, plus masking and metric helpers.

Per-token terms l_BT become a scalar with batch-wide normalisers (see `Aggregation` in
`algorithm_types`), so a micro-batch returns its exact share of the optimizer-batch loss. Masked
positions are selected away with `torch.where` (never multiplied), so they get exactly zero
gradient even when their logprobs are -inf or nan. This module does not compute logprobs.

Shape legend: B = sequences in the micro-batch, T = padded tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import get_args

import torch

from ludic.training.algorithm_types import Aggregation

AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


def check_aggregation(mode: str, constant_normalizer: float | None, owner: str) -> None:
    """Refuse an unknown mode, and "constant" without a positive normaliser (Dr.GRPO's C)."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"{owner}: aggregation must be one of {AGGREGATIONS}, got {mode!r}")
    if mode == "constant" and (
        constant_normalizer is None
        or not math.isfinite(constant_normalizer)
        or constant_normalizer <= 0
    ):
        raise ValueError(
            f"{owner}: aggregation='constant' needs constant_normalizer > 0 (Dr.GRPO uses the "
            f"generation budget, max_tokens), got {constant_normalizer}"
        )


def masked(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """values where mask is True, exact 0.0 elsewhere (no gradient leaks through masked slots)."""
    return torch.where(mask_BT, values_BT, torch.zeros_like(values_BT))


def aggregate(
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: Aggregation,
    *,
    total_action_tokens: float,
    total_sequences: float,
    constant_normalizer: float | None = None,
) -> torch.Tensor:
    """This micro-batch's share of the batch-level aggregate of per-token terms.

    token_mean:          sum_bt m*l / total_action_tokens
    seq_mean_token_mean: sum_b [sum_t m*l / sum_t m] / total_sequences  (empty rows add 0)
    seq_mean_token_sum:  sum_bt m*l / total_sequences
    constant:            sum_bt m*l / (total_sequences * constant_normalizer)
    token_sum:           sum_bt m*l  (no normaliser: the loss grows with the batch's tokens)
    A sequence-level term is broadcast to its tokens first, so it counts once per sequence under
    seq_mean_token_mean and once per action token under token_mean.
    """
    kept_BT = masked(values_BT, mask_BT)
    if mode == "token_mean":
        return kept_BT.sum() / total_action_tokens
    if mode == "seq_mean_token_sum":
        return kept_BT.sum() / total_sequences
    if mode == "token_sum":
        return kept_BT.sum()
    if mode == "seq_mean_token_mean":
        tokens_B = mask_BT.sum(dim=-1).clamp(min=1).to(kept_BT.dtype)
        return (kept_BT.sum(dim=-1) / tokens_B).sum() / total_sequences
    if mode == "constant":
        if constant_normalizer is None:
            raise ValueError("aggregate: mode 'constant' needs constant_normalizer")
        return kept_BT.sum() / (total_sequences * constant_normalizer)
    raise ValueError(f"aggregate: unknown mode {mode!r}; expected one of {AGGREGATIONS}")


def masked_seq_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """[B] mean over each sequence's action tokens (0 for a sequence without any)."""
    tokens_B = mask_BT.sum(dim=-1).clamp(min=1).to(values_BT.dtype)
    return masked(values_BT, mask_BT).sum(dim=-1) / tokens_B


def token_share(values_BT: torch.Tensor, mask_BT: torch.Tensor, total: float) -> float:
    """Additive metric: sum over action tokens / batch-wide count."""
    return float(masked(values_BT.detach(), mask_BT).sum().item()) / total


def ratio_extremes(ratio_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    """`ratio_min` / `ratio_max` over this micro-batch's action tokens (not additive: reduce
    with min / max, see `reduce_metrics`); empty when the micro-batch has no action token."""
    if not bool(mask_BT.any()):
        return {}
    kept = ratio_BT.detach()[mask_BT]
    return {"ratio_min": float(kept.min().item()), "ratio_max": float(kept.max().item())}


def reduce_metrics(per_micro_batch: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Combine micro-batch metrics into batch metrics: keys ending in `_min` take the min,
    `_max` the max, every other key is additive and is summed."""
    out: dict[str, float] = {}
    for metrics in per_micro_batch:
        for key, value in metrics.items():
            if key not in out:
                out[key] = value
            elif key.endswith("_min"):
                out[key] = min(out[key], value)
            elif key.endswith("_max"):
                out[key] = max(out[key], value)
            else:
                out[key] += value
    return out
