"""Credit assigners without state identity: hand-derived weights per turn."""

from __future__ import annotations

import math

import pytest

from ludic.rollouts.samples import CreditAssigner
from ludic.training.credit import (
    ConstantCredit,
    EpisodicReturn,
    GroupNormalizedReturn,
    MonteCarloReturn,
    PerStepReward,
    discounted_returns,
    group_normalize,
)
from ludic.types import AgentStep, EnvironmentStep, Rollout

EPS = 1e-6


def make_rollout(
    rewards: list[float],
    *,
    rid: str,
    group: str | None = "g",
    first_obs: str = "prompt",
    agent: str = "agent_0",
    failed: bool = False,
    parser_reward: float = 0.0,
) -> Rollout:
    """One turn per reward: an AgentStep (parser reward `parser_reward` on turn 0) and the
    EnvironmentStep it led to (env reward = rewards[k])."""
    steps: list[AgentStep | EnvironmentStep] = []
    for k, r in enumerate(rewards):
        obs = first_obs if k == 0 else f"{first_obs}-{k}"
        a = AgentStep(
            index=2 * k,
            turn_id=f"t{k}",
            agent_id=agent,
            reward=parser_reward if k == 0 else 0.0,
            info={"observation": obs},
        )
        e = EnvironmentStep(
            index=2 * k + 1, turn_id=f"t{k}", agent_id=agent, reward=r, agent_step_ids=(a.id,)
        )
        steps += [a, e]
    meta: dict[str, object] = {} if group is None else {"group_id": group}
    if failed:
        meta["error"] = "env crashed"
    return Rollout(id=rid, agent_id=agent, steps=steps, meta=meta)


def test_discounted_returns_by_hand() -> None:
    # r = [1, 0, 2], gamma = 0.5: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0], abs=1e-12)
    assert discounted_returns([], 0.9) == []


def test_group_normalize_by_hand() -> None:
    # [3, 1, 2]: mean 2, centred [1, -1, 0], sample std sqrt((1 + 1 + 0) / 2) = 1
    assert group_normalize([3.0, 1.0, 2.0], normalize_std=True, eps=EPS) == pytest.approx(
        [1 / (1 + EPS), -1 / (1 + EPS), 0.0], abs=1e-12
    )
    assert group_normalize([3.0, 1.0, 2.0], normalize_std=False, eps=EPS) == [1.0, -1.0, 0.0]
    assert group_normalize([5.0], normalize_std=True, eps=EPS) == [0.0]
    assert group_normalize([0.1, 0.1, 0.1], normalize_std=True, eps=EPS) == [0.0, 0.0, 0.0]


def test_monte_carlo_return_uses_turn_reward_including_parser_reward() -> None:
    # turn rewards: t0 = parser 0.5 + env 1 = 1.5, t1 = 0, t2 = 2; gamma 0.5:
    # G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1.5 + 0.5*1 = 2
    r = make_rollout([1.0, 0.0, 2.0], rid="a", parser_reward=0.5)
    w = MonteCarloReturn(gamma=0.5).assign([r])
    assert w == pytest.approx({("a", "t0"): 2.0, ("a", "t1"): 1.0, ("a", "t2"): 2.0}, abs=1e-12)


def test_episodic_per_step_and_constant() -> None:
    r = make_rollout([1.0, 0.0, 2.0], rid="a", parser_reward=0.5)
    # R = 1.5 + 0 + 2 = 3.5 on every turn
    assert EpisodicReturn().assign([r]) == pytest.approx(
        {("a", "t0"): 3.5, ("a", "t1"): 3.5, ("a", "t2"): 3.5}
    )
    assert PerStepReward().assign([r]) == pytest.approx(
        {("a", "t0"): 1.5, ("a", "t1"): 0.0, ("a", "t2"): 2.0}
    )
    assert ConstantCredit(value=0.7).assign([r]) == pytest.approx(
        {("a", "t0"): 0.7, ("a", "t1"): 0.7, ("a", "t2"): 0.7}
    )


@pytest.mark.parametrize(
    "assigner",
    [
        MonteCarloReturn(gamma=0.9),
        EpisodicReturn(),
        PerStepReward(),
        ConstantCredit(),
        GroupNormalizedReturn(),
    ],
)
def test_failed_rollouts_are_skipped(assigner: CreditAssigner) -> None:
    assert isinstance(assigner, CreditAssigner)
    ok = make_rollout([1.0], rid="ok")
    bad = make_rollout([5.0, 5.0], rid="bad", failed=True)
    assert set(assigner.assign([ok, bad])) == {("ok", "t0")}


def test_group_normalized_return_multi_turn_partial_and_singleton_groups() -> None:
    # group g: R_a = 1 + 2 = 3, R_b = 1, R_c = 0 + 2 = 2; the failed rollout (R = 100) is left
    # out, so the group is {3, 1, 2}: mean 2, sample std 1 -> A = [1, -1, 0] / (1 + eps).
    # group h has one finished episode -> 0.
    rollouts = [
        make_rollout([1.0, 2.0], rid="a"),
        make_rollout([1.0], rid="b"),
        make_rollout([0.0, 2.0], rid="c"),
        make_rollout([100.0], rid="dead", failed=True),
        make_rollout([7.0], rid="lonely", group="h"),
    ]
    w = GroupNormalizedReturn(normalize_std=True, eps=EPS).assign(rollouts)
    up, down = 1 / (1 + EPS), -1 / (1 + EPS)
    assert w == pytest.approx(
        {
            ("a", "t0"): up,
            ("a", "t1"): up,
            ("b", "t0"): down,
            ("c", "t0"): 0.0,
            ("c", "t1"): 0.0,
            ("lonely", "t0"): 0.0,
        },
        abs=1e-12,
    )
    w_mean_only = GroupNormalizedReturn(normalize_std=False).assign(rollouts)
    assert w_mean_only[("a", "t1")] == pytest.approx(1.0, abs=1e-12)
    assert w_mean_only[("b", "t0")] == pytest.approx(-1.0, abs=1e-12)


def test_group_falls_back_to_first_observation_and_separates_agents() -> None:
    # No group id: "Q1" rollouts form a group with R = [1, 0]: mean 0.5, centred +-0.5,
    # sample std sqrt(0.5) -> A = +-0.5 / (sqrt(0.5) + eps); "Q2" is alone -> 0.
    # Same group id but another agent: never compared with agent_0 -> alone -> 0.
    rollouts = [
        make_rollout([1.0], rid="x", group=None, first_obs="Q1"),
        make_rollout([0.0], rid="y", group=None, first_obs="Q1"),
        make_rollout([3.0], rid="z", group=None, first_obs="Q2"),
        make_rollout([1.0], rid="p", group="g"),
        make_rollout([0.0], rid="q", group="g", agent="agent_1"),
    ]
    w = GroupNormalizedReturn().assign(rollouts)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert w[("x", "t0")] == pytest.approx(a, abs=1e-9)
    assert w[("y", "t0")] == pytest.approx(-a, abs=1e-9)
    assert w[("z", "t0")] == 0.0
    assert w[("p", "t0")] == 0.0
    assert w[("q", "t0")] == 0.0


def test_duplicate_turn_keys_are_refused() -> None:
    a = make_rollout([1.0], rid="same")
    b = make_rollout([0.0], rid="same")
    with pytest.raises(ValueError, match="appears twice"):
        EpisodicReturn().assign([a, b])


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="gamma"):
        MonteCarloReturn(gamma=1.5)
    with pytest.raises(ValueError, match="eps"):
        GroupNormalizedReturn(eps=-1.0)
