"""Hierarchical credit for delegation (seed 001): how a sub-agent's turns are weighted relative
to the parent episode that delegated to them.

A child rollout names its parent with `meta["parent_rollout_id"]` and the delegating turn with
`meta["parent_turn_id"]` (set by `DelegatingProtocol`). A base assigner first weighs every
rollout on its own (children grouped only with comparable children, see `rollout_group_key`);
then each child turn's weight becomes

    inherit: w_child = w_parent_turn                              (credit flows down)
    own:     w_child = w_own                                      (the child's task or judge reward)
    mix:     w_child = lam * w_parent_turn + (1 - lam) * w_own    (lam = `mix`)

where w_parent_turn is the final weight of the parent turn that made the `delegate` call (so a
grandchild inherits through its parent). Parent turns keep their base weight: this module does
not pass child rewards up to the parent (the child's answer already shaped the parent's outcome).
A child whose parent is in the batch but failed (`rollout.failed`, e.g. its samples could not be
built) has no parent credit to take: it keeps w_own, with a logged warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ludic.rollouts.samples import CreditAssigner, TurnKey
from ludic.training.credit.assigners import GroupNormalizedReturn
from ludic.training.credit.core import active_rollouts
from ludic.types import Rollout

logger = logging.getLogger(__name__)

HierarchyMode = Literal["inherit", "own", "mix"]
_MODES: tuple[str, ...] = ("inherit", "own", "mix")


def _depth(rollout: Rollout) -> int:
    if rollout.meta.get("parent_rollout_id") is None:
        return 0
    return int(rollout.meta.get("delegation_depth", 1))


def _parent_turn(child: Rollout, by_id: Mapping[str, Rollout]) -> TurnKey:
    """The (parent rollout id, delegating turn id) of a child, or a clear error."""
    pid = str(child.meta["parent_rollout_id"])
    if pid not in by_id:
        raise ValueError(
            f"hierarchical credit: child rollout {child.id!r} names parent {pid!r}, which is not "
            "in the batch (or failed); keep a parent and its children in one batch, or use "
            "mode='own'"
        )
    turn_id = child.meta.get("parent_turn_id")
    if turn_id is None:
        raise ValueError(
            f"hierarchical credit: child rollout {child.id!r} has no meta['parent_turn_id']; "
            "rollouts from DelegatingProtocol carry it"
        )
    return (pid, str(turn_id))


def hierarchical_weights(
    rollouts: Sequence[Rollout],
    own: Mapping[TurnKey, float],
    *,
    mode: HierarchyMode,
    mix: float = 0.5,
) -> dict[TurnKey, float]:
    """Per-turn weights after passing credit down the delegation tree (see the module
    docstring). `own` is the base assigner's result for the same rollouts."""
    if mode not in _MODES:
        raise ValueError(f"hierarchical credit: mode must be one of {_MODES}, got {mode!r}")
    out = dict(own)
    if mode == "own":
        return out
    lam = 1.0 if mode == "inherit" else mix
    live = active_rollouts(rollouts)
    by_id = {r.id: r for r in live}
    failed_ids = {r.id for r in rollouts if r.failed}
    orphans: list[Rollout] = []
    for child in sorted((r for r in live if _depth(r) > 0), key=_depth):  # parents first
        if str(child.meta["parent_rollout_id"]) in failed_ids:
            orphans.append(child)  # no parent credit to pass down: it keeps its own
            continue
        parent_key = _parent_turn(child, by_id)
        if parent_key not in out:
            raise ValueError(
                f"hierarchical credit: the delegating turn {parent_key[1]!r} of rollout "
                f"{parent_key[0]!r} got no weight from the base assigner"
            )
        inherited = out[parent_key]
        for turn in child.turns():
            key = (child.id, turn.turn_id)
            if key in out:
                out[key] = lam * inherited + (1.0 - lam) * own[key]
    if orphans:
        first = orphans[0]
        logger.warning(
            "hierarchical credit: %d child rollout(s) keep their own weight (mode=%r ignored "
            "for them), as the parent episode that delegated to them failed: e.g. %r under %r",
            len(orphans),
            mode,
            first.id,
            first.meta["parent_rollout_id"],
        )
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class HierarchicalCredit:
    """Credit for a delegating agent and its sub-agents trained from one batch.

    `base` weighs every rollout on its own (default: GRPO's `GroupNormalizedReturn`, whose
    groups keep parents and each sub-agent apart); `mode` then sets each child turn to the
    parent's delegating-turn weight ("inherit"), keeps the child's own ("own"), or mixes them
    with weight `mix` on the parent's ("mix"). See `hierarchical_weights` for the formula.
    """

    base: CreditAssigner = field(default_factory=GroupNormalizedReturn)
    mode: HierarchyMode = "mix"
    mix: float = 0.5

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"HierarchicalCredit: mode must be one of {_MODES}, got {self.mode!r}")
        if not (math.isfinite(self.mix) and 0.0 <= self.mix <= 1.0):
            raise ValueError(f"HierarchicalCredit: mix must be in [0, 1], got {self.mix}")

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        own = self.base.assign(rollouts)
        return hierarchical_weights(rollouts, own, mode=self.mode, mix=self.mix)
