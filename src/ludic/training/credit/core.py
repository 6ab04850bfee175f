"""Pure functions behind the credit assigners: discounted returns, group normalisation and the
keys that say which rollouts (episode groups) and which turns (anchor states) are compared.

Nothing here knows about tensors or samples; weights are plain Python floats (float64).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Hashable, Iterable, Sequence

from ludic.rollouts.samples import TurnKey
from ludic.types import Rollout, Turn

GroupKey = tuple[str, str, str]  # (agent id, "group_id" | "observation", value)
AnchorKey = Hashable
AnchorKeyFn = Callable[[Turn], AnchorKey | None]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Return-to-go of each step: G_k = sum_{j >= k} gamma^(j - k) * r_j."""
    returns = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        returns[k] = running
    return returns


def group_normalize(values: Sequence[float], *, normalize_std: bool, eps: float) -> list[float]:
    """(v - mean) / (std + eps) within one group, or v - mean when `normalize_std` is False.

    `std` is the sample standard deviation (Bessel's n - 1, as `torch.std` in the GRPO and
    GiGPO reference code). A group of one has no baseline to compare with and gets 0; a group
    whose values are all equal gets exactly 0.
    """
    n = len(values)
    if n <= 1 or max(values) == min(values):
        return [0.0] * n
    mean = math.fsum(values) / n
    centered = [float(v) - mean for v in values]
    if not normalize_std:
        return centered
    std = math.sqrt(math.fsum(c * c for c in centered) / (n - 1))
    return [c / (std + eps) for c in centered]


def active_rollouts(rollouts: Iterable[Rollout]) -> list[Rollout]:
    """The rollouts credit is assigned to: failed episodes (`rollout.failed`) are left out,
    both from the result and from every group statistic."""
    return [r for r in rollouts if not r.failed]


def rollout_group_key(rollout: Rollout, turns: Sequence[Turn]) -> GroupKey:
    """Which episodes are compared with each other (GRPO groups).

    Rollouts share a group when they have the same agent id and the same
    `meta["group_id"]`; a rollout without a group id falls back to its first turn's
    observation text (same prompt, same group). Different agents are never compared.

    A delegated (child) rollout, one with `meta["parent_rollout_id"]`, is compared only with
    children of the same sub-agent at the same delegation depth under the same parent group
    (the engine stamps the parent's group id on its children): its kind is "delegation", so a
    parent and its children never share a baseline even when their agent ids coincide.
    """
    gid = rollout.group_id
    first_obs = turns[0].observation if turns else ""
    if rollout.meta.get("parent_rollout_id") is not None:
        scope = gid if gid is not None else f"observation:{first_obs}"
        sub_agent = rollout.meta.get("sub_agent", "")
        depth = rollout.meta.get("delegation_depth", 1)
        return (rollout.agent_id, "delegation", f"{scope}|{sub_agent}|{depth}")
    if gid is not None:
        return (rollout.agent_id, "group_id", gid)
    return (rollout.agent_id, "observation", first_obs)


def group_rollouts(rollouts: Iterable[Rollout]) -> dict[GroupKey, list[tuple[Rollout, list[Turn]]]]:
    """The non-failed rollouts with their turns, by `rollout_group_key`, in batch order."""
    groups: dict[GroupKey, list[tuple[Rollout, list[Turn]]]] = {}
    for rollout in active_rollouts(rollouts):
        turns = rollout.turns()
        groups.setdefault(rollout_group_key(rollout, turns), []).append((rollout, turns))
    return groups


def default_anchor_key(turn: Turn) -> AnchorKey | None:
    """The state a turn acted from, for GiGPO anchor grouping.

    The env's `state_key` when the protocol recorded one, else a SHA-256 of the observation
    text. A turn with no agent steps (an outcome the agent only observed) has no anchor: None.
    """
    if not turn.agent_steps:
        return None
    key = turn.state_key
    if key is not None:
        # JSON text so a tuple key and its JSON round-tripped list compare equal.
        return ("state_key", key if isinstance(key, str) else json.dumps(key, sort_keys=True))
    digest = hashlib.sha256(turn.observation.encode("utf-8")).hexdigest()
    return ("observation", digest)


def turn_key(rollout: Rollout, turn: Turn, seen: set[TurnKey]) -> TurnKey:
    """`(rollout.id, turn.turn_id)`, refusing a key already used in this batch."""
    key = (rollout.id, turn.turn_id)
    if key in seen:
        raise ValueError(
            f"credit: turn {turn.turn_id!r} of rollout {rollout.id!r} appears twice in the batch; "
            "give every turn of a rollout its own turn_id and every rollout its own id"
        )
    seen.add(key)
    return key


def check_gamma(gamma: float, owner: str) -> None:
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"{owner}: gamma must be in [0, 1], got {gamma}")


def check_eps(eps: float, owner: str) -> None:
    if eps < 0.0 or not math.isfinite(eps):
        raise ValueError(f"{owner}: eps must be a finite number >= 0, got {eps}")
