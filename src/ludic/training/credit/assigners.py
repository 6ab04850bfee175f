"""Credit assigners that need no state identity: per-turn returns, episode returns, group
baselines (GRPO) and constants (SFT). Each class only holds configuration; `assign` maps every
turn of every non-failed rollout to one float. Snapshot segments are a sample-level concept built
later: credit here is per turn, and every sample of a turn inherits its turn's weight.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ludic.rollouts.samples import TurnKey
from ludic.training.credit.core import (
    GroupKey,
    active_rollouts,
    check_eps,
    check_gamma,
    discounted_returns,
    group_normalize,
    rollout_group_key,
    turn_key,
)
from ludic.types import AgentStep, Rollout, Turn


def _per_turn(rollouts: Sequence[Rollout]) -> list[tuple[Rollout, list[Turn]]]:
    return [(r, r.turns()) for r in active_rollouts(rollouts)]


@dataclass(frozen=True, kw_only=True, slots=True)
class MonteCarloReturn:
    """Each turn gets its discounted return-to-go: A_k = sum_{j >= k} gamma^(j - k) * r_j,
    where r_j is turn j's reward (`Turn.reward`). No baseline."""

    gamma: float = 1.0

    def __post_init__(self) -> None:
        check_gamma(self.gamma, "MonteCarloReturn")

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        for rollout, turns in _per_turn(rollouts):
            returns = discounted_returns([t.reward for t in turns], self.gamma)
            for turn, g in zip(turns, returns, strict=True):
                out[turn_key(rollout, turn, seen)] = g
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodicReturn:
    """Every turn gets the undiscounted episode return R = sum_j r_j. No baseline."""

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        for rollout, turns in _per_turn(rollouts):
            episode_return = math.fsum(t.reward for t in turns)
            for turn in turns:
                out[turn_key(rollout, turn, seen)] = episode_return
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class PerStepReward:
    """Each turn gets only its own reward r_k (a bandit view of every turn)."""

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        for rollout, turns in _per_turn(rollouts):
            for turn in turns:
                out[turn_key(rollout, turn, seen)] = float(turn.reward)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ConstantCredit:
    """Every turn gets `value` (1.0 turns the REINFORCE loss into SFT's NLL)."""

    value: float = 1.0

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        for rollout, turns in _per_turn(rollouts):
            for turn in turns:
                out[turn_key(rollout, turn, seen)] = float(self.value)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupNormalizedReturn:
    """GRPO's group-relative advantage, given to every turn of an episode:

        A_i = (R_i - mean_G(R)) / (std_G(R) + eps)   (normalize_std=True, GRPO)
        A_i = R_i - mean_G(R)                        (normalize_std=False, Dr.GRPO / RLOO-like)

    R_i is episode i's undiscounted return and G the episodes of its group: same agent id and
    same `meta["group_id"]`, or, for rollouts without a group id, the same first-turn
    observation text. std is the sample std (n - 1). Failed rollouts are left out, so a partial
    group is normalised over the episodes that finished; a group of one gets 0.

    With `split_over_turns`, each of episode i's n_i trained turns (the turns that become a
    sample in sample mode "turn", see `_trained_turns`) gets A_i / n_i instead of A_i, so an
    episode's samples weigh A_i in the loss whatever its turn count: off, a k-turn episode (one
    that retried after parse failures, say) pushes its advantage k times, and a group whose
    losers took more turns than its winners sums below zero. Leave it off in sample mode
    "episode", where an episode is already one sample.
    """

    normalize_std: bool = True
    eps: float = 1e-6
    split_over_turns: bool = False

    def __post_init__(self) -> None:
        check_eps(self.eps, "GroupNormalizedReturn")

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        groups: dict[GroupKey, list[tuple[Rollout, list[Turn]]]] = defaultdict(list)
        for rollout, turns in _per_turn(rollouts):
            groups[rollout_group_key(rollout, turns)].append((rollout, turns))
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        for members in groups.values():
            returns = [math.fsum(t.reward for t in turns) for _, turns in members]
            advantages = group_normalize(returns, normalize_std=self.normalize_std, eps=self.eps)
            for (rollout, turns), adv in zip(members, advantages, strict=True):
                share = adv / _trained_turns(turns) if self.split_over_turns else adv
                for turn in turns:
                    out[turn_key(rollout, turn, seen)] = share
        return out


def _trained_turns(turns: Sequence[Turn]) -> int:
    """How many of an episode's turns build a sample in sample mode "turn"
    (`ludic.rollouts.build_samples`), at least 1 so a division is safe: the turns the agent
    acted in with at least one completion token. A turn whose replies were all empty builds
    none; counted, it would leave the episode's samples summing to less than A."""
    return max(1, sum(1 for turn in turns if any(map(_has_completion, turn.agent_steps))))


def _has_completion(step: AgentStep) -> bool:
    """Whether the step sampled a token. A step without a token trace is retokenized when its
    samples are built (`ChatTemplateRetokenizer`), and the template renders even an empty
    reply with its end-of-turn tokens: it counts."""
    return step.trace is None or len(step.trace.completion_token_ids) > 0
