"""GiGPO credit (Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training",
arXiv:2505.10978): a GRPO episode-level advantage plus a step-level advantage computed among the
turns of the same episode group that acted from the same anchor state. Critic-free; it does not
merge "similar" states (exact key match only) and does not look inside observations beyond the key.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ludic.rollouts.samples import TurnKey
from ludic.training.credit.core import (
    AnchorKey,
    AnchorKeyFn,
    GroupKey,
    active_rollouts,
    check_eps,
    check_gamma,
    default_anchor_key,
    discounted_returns,
    group_normalize,
    rollout_group_key,
    turn_key,
)
from ludic.types import Rollout, Turn

Combine = Literal["paper", "seed003"]
EpisodeStat = Literal["trajectory", "step_rows"]
_EPISODE_STATS: tuple[str, ...] = ("trajectory", "step_rows")
FINAL_SCORE_KEY = "final_score"


def episode_advantages(
    scores: Sequence[float],
    lengths: Sequence[int],
    *,
    stat: EpisodeStat,
    normalize_std: bool,
    eps: float,
) -> list[float]:
    """A_E per episode of one group, with mean and std taken over

    trajectory: one value per episode (the paper's eq. 4; the default here);
    step_rows:  one value per turn, each turn carrying its episode's score, so long episodes
                weigh more (verl-agent's `compute_mean_std_cross_all_data=True`).
    A_E(i) = (F_i - mean) / (std + eps), or F_i - mean; sample std (n - 1) either way.
    """
    if stat == "trajectory":
        return group_normalize(scores, normalize_std=normalize_std, eps=eps)
    rows = [float(f) for f, n in zip(scores, lengths, strict=True) for _ in range(n)]
    if len(rows) <= 1 or max(scores) == min(scores):
        return [0.0] * len(scores)
    mean = math.fsum(rows) / len(rows)
    if not normalize_std:
        return [float(f) - mean for f in scores]
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rows) / (len(rows) - 1))
    return [(float(f) - mean) / (std + eps) for f in scores]


@dataclass(frozen=True, kw_only=True, slots=True)
class GiGPOTurnCredit:
    """How one turn's GiGPO weight was derived (for logs and sample meta).

    `anchor_group_size` counts the turns (this one included) in its anchor group; 0 when the
    turn has no anchor state (it gets A_S = 0, as does a group of one).
    """

    episode_advantage: float
    step_advantage: float
    return_to_go: float
    anchor_group_size: int
    advantage: float


def combine_advantages(
    episode_advantage: float, step_advantage: float, *, omega: float, combine: Combine
) -> float:
    """paper:   A = A_E + omega * A_S              (GiGPO eq. 8; omega = 1 in the paper)
    seed003: A = omega * A_E + (1 - omega) * A_S  (a convex mix; omega = 0.5 is the paper's
    direction at half the scale). seed003 with omega' equals omega' times the paper form with
    omega = (1 - omega') / omega': same direction, different scale."""
    if combine == "paper":
        return episode_advantage + omega * step_advantage
    return omega * episode_advantage + (1.0 - omega) * step_advantage


def gigpo_group_credit(
    rewards: Sequence[Sequence[float]],
    anchors: Sequence[Sequence[AnchorKey | None]],
    *,
    gamma: float,
    omega: float,
    combine: Combine,
    normalize_std: bool,
    step_normalize_std: bool,
    eps: float,
    final_scores: Sequence[float | None] | None = None,
    default_step_reward: float = 0.0,
    episode_stat: EpisodeStat = "trajectory",
) -> list[list[GiGPOTurnCredit]]:
    """GiGPO for one episode group. `rewards[i][k]` and `anchors[i][k]` are episode i's turn k;
    `final_scores[i]` is episode i's final score, kept apart from its step rewards (None: none).

    F_i      = final_scores[i] when given, else R_i = sum_k r_ik (undiscounted episode return)
    A_E(i)   = episode_advantages(F, stat=episode_stat)[i]
    r'_ik    = r_ik + default_step_reward (+ final_scores[i] on the last turn)
    G_ik     = sum_{j >= k} gamma^(j - k) r'_ij (discounted return-to-go)
    A_S(i,k) = group_normalize({G_jl : anchor_jl == anchor_ik})[ik]; 0 for no anchor or a
               group of one. Revisits of a state within one episode join the same anchor group.

    A reply that did not parse leaves the state as it was, so its turn joins that state's
    anchor group, by design: it is one more action taken from there, with return-to-go
    (parser penalty + gamma * the retry's return), so it ranks below the valid actions from
    that state and the retry ranks as a first-try valid action with the same outcome.
    Excluding it (A_S = 0) would drop that comparison. Without a state key the same holds: a
    turn's observation is the env's, which the failure left as it was (the parser's feedback
    is in the retry's prompt, not its anchor).
    """
    finals = list(final_scores) if final_scores is not None else [None] * len(rewards)
    scores = [math.fsum(r) if f is None else float(f) for r, f in zip(rewards, finals, strict=True)]
    episode_adv = episode_advantages(
        scores,
        [len(r) for r in rewards],
        stat=episode_stat,
        normalize_std=normalize_std,
        eps=eps,
    )
    returns = [
        discounted_returns(_step_rewards(r, f, default_step_reward), gamma)
        for r, f in zip(rewards, finals, strict=True)
    ]
    members: dict[AnchorKey, list[tuple[int, int]]] = defaultdict(list)
    for i, episode_anchors in enumerate(anchors):
        for k, anchor in enumerate(episode_anchors):
            if anchor is not None:
                members[anchor].append((i, k))
    step_adv: dict[tuple[int, int], tuple[float, int]] = {}
    for positions in members.values():
        values = [returns[i][k] for i, k in positions]
        normed = group_normalize(values, normalize_std=step_normalize_std, eps=eps)
        for pos, a in zip(positions, normed, strict=True):
            step_adv[pos] = (a, len(positions))
    out: list[list[GiGPOTurnCredit]] = []
    for i, episode_returns in enumerate(returns):
        row = []
        for k, g in enumerate(episode_returns):
            a_s, size = step_adv.get((i, k), (0.0, 0))
            row.append(
                GiGPOTurnCredit(
                    episode_advantage=episode_adv[i],
                    step_advantage=a_s,
                    return_to_go=g,
                    anchor_group_size=size,
                    advantage=combine_advantages(episode_adv[i], a_s, omega=omega, combine=combine),
                )
            )
        out.append(row)
    return out


def _step_rewards(rewards: Sequence[float], final: float | None, default: float) -> list[float]:
    out = [float(r) + default for r in rewards]
    if final is not None and out:
        out[-1] += float(final)
    return out


def rollout_final_score(rollout: Rollout) -> float | None:
    """`rollout.meta["final_score"]` (a score of the whole episode, e.g. from a judge), or None."""
    value = rollout.meta.get(FINAL_SCORE_KEY)
    if value is None:
        return None
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(
            f"GiGPO: rollout {rollout.id!r} has meta['final_score'] = {value!r}; a final score "
            "must be a finite number"
        )
    return score


@dataclass(frozen=True, kw_only=True, slots=True)
class GiGPO:
    """GiGPO credit assigner: A = combine(A_E, A_S) per turn (see `gigpo_group_credit`).

    Episode groups are those of `GroupNormalizedReturn` (agent id + `meta["group_id"]`, else the
    first observation text); failed rollouts are left out. Anchor states come from `anchor_key`
    (default: the env's `state_key`, else a hash of the observation text). `omega` defaults to
    1.0 for `combine="paper"` (the paper's setting) and 0.5 for `combine="seed003"` (the same
    direction). `normalize_std` / `step_normalize_std` pick mean-std or mean-only normalisation
    for A_E and A_S (the reference code's "mean_std_norm" / "mean_norm").

    Seed 003's reward inputs: a rollout's `meta["final_score"]`, when present, is its final
    score F_i: A_E compares final scores (not step-reward sums) and F_i is added to the last
    turn's reward for the returns-to-go; `default_step_reward` is added to every turn's reward
    (e.g. a small negative time penalty when step rewards are sparse). `episode_stat` says over
    what A_E's mean and std run: "trajectory" (default, the paper's equation: one value per
    episode) or "step_rows" (one per turn, as verl-agent's default computes it).
    """

    gamma: float = 0.95
    omega: float | None = None
    combine: Combine = "paper"
    normalize_std: bool = True
    step_normalize_std: bool = True
    eps: float = 1e-6
    anchor_key: AnchorKeyFn = default_anchor_key
    default_step_reward: float = 0.0
    episode_stat: EpisodeStat = "trajectory"

    def __post_init__(self) -> None:
        check_gamma(self.gamma, "GiGPO")
        check_eps(self.eps, "GiGPO")
        if self.episode_stat not in _EPISODE_STATS:
            raise ValueError(
                f"GiGPO: episode_stat must be one of {_EPISODE_STATS}, got {self.episode_stat!r}"
            )
        if not math.isfinite(self.default_step_reward):
            raise ValueError(
                f"GiGPO: default_step_reward must be finite, got {self.default_step_reward}"
            )
        if self.combine not in ("paper", "seed003"):
            raise ValueError(f"GiGPO: combine must be 'paper' or 'seed003', got {self.combine!r}")
        omega = self.effective_omega
        if self.combine == "seed003" and not 0.0 <= omega <= 1.0:
            raise ValueError(f"GiGPO: with combine='seed003' omega must be in [0, 1], got {omega}")
        if self.combine == "paper" and not (omega >= 0.0 and math.isfinite(omega)):
            raise ValueError(f"GiGPO: omega must be a finite number >= 0, got {omega}")

    @property
    def effective_omega(self) -> float:
        if self.omega is not None:
            return float(self.omega)
        return 1.0 if self.combine == "paper" else 0.5

    def details(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, GiGPOTurnCredit]:
        """Per-turn breakdown (A_E, A_S, return-to-go, anchor group size, final advantage)."""
        groups: dict[GroupKey, list[tuple[Rollout, list[Turn]]]] = defaultdict(list)
        for rollout in active_rollouts(rollouts):
            turns = rollout.turns()
            groups[rollout_group_key(rollout, turns)].append((rollout, turns))
        out: dict[TurnKey, GiGPOTurnCredit] = {}
        seen: set[TurnKey] = set()
        for members in groups.values():
            credits = gigpo_group_credit(
                [[t.reward for t in turns] for _, turns in members],
                [[self.anchor_key(t) for t in turns] for _, turns in members],
                gamma=self.gamma,
                omega=self.effective_omega,
                combine=self.combine,
                normalize_std=self.normalize_std,
                step_normalize_std=self.step_normalize_std,
                eps=self.eps,
                final_scores=[rollout_final_score(r) for r, _ in members],
                default_step_reward=self.default_step_reward,
                episode_stat=self.episode_stat,
            )
            for (rollout, turns), row in zip(members, credits, strict=True):
                for turn, credit in zip(turns, row, strict=True):
                    out[turn_key(rollout, turn, seen)] = credit
        return out

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        return {key: c.advantage for key, c in self.details(rollouts).items()}
