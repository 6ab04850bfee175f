"""Critic-free baselines beside GRPO's: RLOO's leave-one-out mean, and REINFORCE++'s batch
whitening with or without a group-mean baseline first. Pure functions plus configuration-only
assigners; no learned value function, and no KL term folded into the reward (REINFORCE++ puts a
per-token KL penalty in the reward; here add one as a loss term, `with_regularizers(kl_beta=...)`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ludic.rollouts.samples import TurnKey
from ludic.training.credit.core import (
    check_eps,
    check_gamma,
    discounted_returns,
    group_rollouts,
    turn_key,
)
from ludic.types import Rollout


def leave_one_out(values: Sequence[float]) -> list[float]:
    """RLOO: A_i = v_i - mean_{j != i} v_j = G / (G - 1) * (v_i - mean(v)); a group of one
    has no other sample to compare with and gets 0."""
    n = len(values)
    if n <= 1:
        return [0.0] * n
    total = math.fsum(values)
    return [float(v) - (total - float(v)) / (n - 1) for v in values]


def whiten(values: Sequence[float], *, eps: float) -> list[float]:
    """Batch whitening: (v - mean) / sqrt(var + eps), var the sample variance (n - 1), as
    verl's `masked_whiten`. Fewer than two values give 0."""
    n = len(values)
    if n <= 1:
        return [0.0] * n
    mean = math.fsum(values) / n
    centered = [float(v) - mean for v in values]
    var = math.fsum(c * c for c in centered) / (n - 1)
    return [c / math.sqrt(var + eps) for c in centered]


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaveOneOutReturn:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): every turn of episode i gets
    A_i = R_i - mean_{j != i} R_j over the other episodes of its group (groups as in
    `GroupNormalizedReturn`). Unbiased, unlike the group mean that includes R_i."""

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        for members in group_rollouts(rollouts).values():
            returns = [math.fsum(t.reward for t in turns) for _, turns in members]
            for (rollout, turns), adv in zip(members, leave_one_out(returns), strict=True):
                for turn in turns:
                    out[turn_key(rollout, turn, seen)] = adv
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ReinforcePlusPlus:
    """REINFORCE++ (Hu, arXiv:2501.03262), at turn level:

        group_baseline=False: A_k = whiten_batch(G_k), G_k the discounted return-to-go
        group_baseline=True:  A_i = whiten_batch(R_i - mean_group(R))   ("REINFORCE++-baseline")

    Whitening runs over every turn of every non-failed rollout in the batch (one value per
    turn); verl whitens over tokens, so its long turns count more than here.
    """

    group_baseline: bool = False
    gamma: float = 1.0
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_gamma(self.gamma, "ReinforcePlusPlus")
        check_eps(self.eps, "ReinforcePlusPlus")

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        keys: list[TurnKey] = []
        raw: list[float] = []
        seen: set[TurnKey] = set()
        for members in group_rollouts(rollouts).values():
            returns = [math.fsum(t.reward for t in turns) for _, turns in members]
            mean = math.fsum(returns) / len(returns)
            for (rollout, turns), episode_return in zip(members, returns, strict=True):
                if self.group_baseline:
                    values = [episode_return - mean] * len(turns)
                else:
                    values = discounted_returns([t.reward for t in turns], self.gamma)
                for turn, value in zip(turns, values, strict=True):
                    keys.append(turn_key(rollout, turn, seen))
                    raw.append(value)
        return dict(zip(keys, whiten(raw, eps=self.eps), strict=True))
