"""Advantage-weighted regression credit (Peng et al. 2019, arXiv:1910.00177), value-free:

    w = min(exp(A / beta), max_weight)

with A a critic-free advantage of each turn's return. The weight multiplies the turn's
log-likelihood (`ReinforceLoss`), so AWR is weighted SFT on stored rollouts: good turns count
more, bad ones less, none negatively. No value network is fitted (the paper fits one); the
baselines are the group mean or the mean over the rollouts given to `assign`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ludic.rollouts.samples import TurnKey
from ludic.training.credit.core import (
    active_rollouts,
    check_eps,
    check_gamma,
    discounted_returns,
    group_normalize,
    group_rollouts,
    turn_key,
)
from ludic.types import Rollout

AWRBaseline = Literal["group", "mean"]
_BASELINES: tuple[str, ...] = ("group", "mean")


def awr_weights(advantages: Sequence[float], *, beta: float, max_weight: float) -> list[float]:
    """w_i = min(exp(A_i / beta), max_weight), computed so a huge A_i / beta cannot overflow."""
    log_cap = math.log(max_weight)
    return [max_weight if a / beta >= log_cap else math.exp(a / beta) for a in advantages]


@dataclass(frozen=True, kw_only=True, slots=True)
class AWRCredit:
    """AWR weights per turn: w = min(exp(A / beta), max_weight).

    baseline="group": A = R_i - mean_group(R) (divided by the group's std when `normalize_std`),
        R_i the episode return, groups as in `GroupNormalizedReturn` (group id, else the first
        observation); every turn of the episode shares it.
    baseline="mean":  A_k = G_k - mean(G) with G_k the turn's discounted return-to-go and the
        mean over every turn passed to `assign` (the whole dataset for `OfflineBatchSource`).
    The paper uses beta = 0.05 on its returns and max_weight = 20; beta here defaults to 1.0
    for rewards in [-1, 1].
    """

    beta: float = 1.0
    max_weight: float = 20.0
    baseline: AWRBaseline = "group"
    normalize_std: bool = False
    gamma: float = 1.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"AWRCredit: beta must be a finite number > 0, got {self.beta}")
        if not (math.isfinite(self.max_weight) and self.max_weight > 0):
            raise ValueError(f"AWRCredit: max_weight must be finite and > 0, got {self.max_weight}")
        if self.baseline not in _BASELINES:
            raise ValueError(
                f"AWRCredit: baseline must be one of {_BASELINES}, got {self.baseline!r}"
            )
        check_gamma(self.gamma, "AWRCredit")
        check_eps(self.eps, "AWRCredit")

    def advantages(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        """A per turn, before the exponential."""
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        if self.baseline == "group":
            for members in group_rollouts(rollouts).values():
                returns = [math.fsum(t.reward for t in turns) for _, turns in members]
                advs = group_normalize(returns, normalize_std=self.normalize_std, eps=self.eps)
                for (rollout, turns), adv in zip(members, advs, strict=True):
                    for turn in turns:
                        out[turn_key(rollout, turn, seen)] = adv
            return out
        per_turn: list[tuple[TurnKey, float]] = []
        for rollout in active_rollouts(rollouts):
            turns = rollout.turns()
            returns = discounted_returns([t.reward for t in turns], self.gamma)
            per_turn += [
                (turn_key(rollout, t, seen), g) for t, g in zip(turns, returns, strict=True)
            ]
        mean = math.fsum(g for _, g in per_turn) / len(per_turn) if per_turn else 0.0
        return {key: g - mean for key, g in per_turn}

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        advantages = self.advantages(rollouts)
        weights = awr_weights(list(advantages.values()), beta=self.beta, max_weight=self.max_weight)
        return dict(zip(advantages.keys(), weights, strict=True))
