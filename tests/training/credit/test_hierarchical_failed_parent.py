"""A child rollout whose parent episode is in the batch but failed: there is no parent credit
to pass down, so it keeps its own weight (with a warning) instead of failing the whole batch,
and a grandchild then inherits from it. A parent missing from the batch is still refused."""

from __future__ import annotations

import logging

import pytest

from ludic.training.credit import hierarchical_weights
from ludic.types import AgentStep, EnvironmentStep, Rollout


def rollout(rid: str, turn: str, **meta: object) -> Rollout:
    a = AgentStep(turn_id=turn, info={"observation": rid})
    e = EnvironmentStep(turn_id=turn, reward=1.0, agent_step_ids=(a.id,))
    return Rollout(id=rid, steps=[a, e], meta=dict(meta))


def test_children_of_a_failed_parent_keep_their_own_weight(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parent = rollout("p", "tp", error="building samples failed")
    child = rollout("c", "tc", parent_rollout_id="p", parent_turn_id="tp", delegation_depth=1)
    grand = rollout("g", "tg", parent_rollout_id="c", parent_turn_id="tc", delegation_depth=2)
    own = {("c", "tc"): 1.0, ("g", "tg"): -1.0}  # a base assigner skips the failed parent
    with caplog.at_level(logging.WARNING, logger="ludic.training.credit.hierarchical"):
        out = hierarchical_weights([grand, parent, child], own, mode="mix", mix=0.5)
    # c keeps its own 1.0; g = 0.5 * 1.0 + 0.5 * (-1.0) = 0.0
    assert out == {("c", "tc"): 1.0, ("g", "tg"): 0.0}
    (message,) = [r.getMessage() for r in caplog.records]
    assert "1 child rollout(s) keep their own weight" in message
    assert "'c' under 'p'" in message


def test_a_parent_missing_from_the_batch_is_still_refused() -> None:
    child = rollout("c", "tc", parent_rollout_id="p", parent_turn_id="tp", delegation_depth=1)
    with pytest.raises(ValueError, match="not in the batch"):
        hierarchical_weights([child], {("c", "tc"): 1.0}, mode="inherit")
