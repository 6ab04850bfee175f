"""GiGPO's seed-003 reward inputs (final scores kept apart from step rewards, a default step
reward) and the two episode-level statistics (over trajectories, over step rows), by hand."""

from __future__ import annotations

import math

import pytest

from ludic.training.credit import GiGPO
from ludic.training.credit.gigpo import episode_advantages
from ludic.types import AgentStep, EnvironmentStep, Rollout

EPS = 1e-6


def episode(turns: list[tuple[str, float]], *, rid: str, **meta: object) -> Rollout:
    """turns = [(state key, env reward)], one group "g"."""
    steps: list[AgentStep | EnvironmentStep] = []
    for k, (state, reward) in enumerate(turns):
        a = AgentStep(turn_id=f"t{k}", info={"observation": f"{rid}-{k}", "state_key": state})
        steps += [a, EnvironmentStep(turn_id=f"t{k}", reward=reward, agent_step_ids=(a.id,))]
    return Rollout(id=rid, steps=steps, meta={"group_id": "g", **meta})


# e_a: s0 r=0, s1 r=0, s2 r=1 (3 turns, R = 1); e_b: s0 r=0 (1 turn, R = 0)
def group() -> list[Rollout]:
    return [
        episode([("s0", 0.0), ("s1", 0.0), ("s2", 1.0)], rid="a"),
        episode([("s0", 0.0)], rid="b"),
    ]


def test_episode_statistic_over_trajectories_or_step_rows() -> None:
    # trajectory: values [1, 0], mean 0.5, sample std sqrt(0.5) -> +-0.5 / 0.70711
    s = math.sqrt(0.5)
    assert episode_advantages(
        [1.0, 0.0], [3, 1], stat="trajectory", normalize_std=True, eps=EPS
    ) == pytest.approx([0.5 / (s + EPS), -0.5 / (s + EPS)], abs=1e-9)
    # step rows: [1, 1, 1, 0], mean 0.75, sample std sqrt((3 * 0.0625 + 0.5625) / 3) = 0.5
    assert episode_advantages(
        [1.0, 0.0], [3, 1], stat="step_rows", normalize_std=True, eps=EPS
    ) == pytest.approx([0.25 / (0.5 + EPS), -0.75 / (0.5 + EPS)], abs=1e-9)
    assert episode_advantages(
        [1.0, 0.0], [3, 1], stat="step_rows", normalize_std=False, eps=EPS
    ) == pytest.approx([0.25, -0.75], abs=1e-12)
    assert episode_advantages(
        [2.0, 2.0], [3, 1], stat="step_rows", normalize_std=True, eps=EPS
    ) == [
        0.0,
        0.0,
    ]


def test_gigpo_episode_stat_changes_only_a_e() -> None:
    # mean-only, gamma 1: A_S at s0 compares G = [1, 0] -> [0.5, -0.5]; s1, s2 alone -> 0
    for stat, a_e in (("trajectory", (0.5, -0.5)), ("step_rows", (0.25, -0.75))):
        credit = GiGPO(gamma=1.0, normalize_std=False, step_normalize_std=False, episode_stat=stat)  # type: ignore[arg-type]
        d = credit.details(group())
        assert [d[("a", f"t{k}")].episode_advantage for k in range(3)] == pytest.approx(
            [a_e[0]] * 3
        )
        assert d[("b", "t0")].episode_advantage == pytest.approx(a_e[1])
        assert d[("a", "t0")].step_advantage == pytest.approx(0.5)
        assert d[("b", "t0")].advantage == pytest.approx(a_e[1] - 0.5)


def test_final_scores_and_default_step_reward() -> None:
    # final scores F = [2, 0] replace the step-reward sums in A_E: mean 1 -> A_E = [1, -1].
    # step rewards + default -0.1, F added on the last turn, gamma 1:
    #   a: r' = [-0.1, -0.1, 1 - 0.1 + 2] = [-0.1, -0.1, 2.9] -> G = [2.7, 2.8, 2.9]
    #   b: r' = [0 - 0.1 + 0]                                   -> G = [-0.1]
    # A_S at s0: G = [2.7, -0.1], mean 1.3 -> [1.4, -1.4]; s1, s2 alone -> 0
    # A = A_E + A_S: a = [2.4, 1, 1], b = [-2.4]
    rollouts = group()
    rollouts[0].meta["final_score"] = 2.0
    rollouts[1].meta["final_score"] = 0.0
    credit = GiGPO(
        gamma=1.0, normalize_std=False, step_normalize_std=False, default_step_reward=-0.1
    )
    d = credit.details(rollouts)
    assert [d[("a", f"t{k}")].return_to_go for k in range(3)] == pytest.approx([2.7, 2.8, 2.9])
    assert d[("b", "t0")].return_to_go == pytest.approx(-0.1)
    assert credit.assign(rollouts) == pytest.approx(
        {("a", "t0"): 2.4, ("a", "t1"): 1.0, ("a", "t2"): 1.0, ("b", "t0"): -2.4}, abs=1e-9
    )


def test_a_rollout_without_final_score_uses_its_return_and_bad_scores_are_refused() -> None:
    rollouts = group()
    rollouts[0].meta["final_score"] = 0.0  # F = [0, R_b = 0]: equal scores, A_E = 0
    d = GiGPO(gamma=1.0, normalize_std=False).details(rollouts)
    assert d[("a", "t0")].episode_advantage == 0.0 and d[("b", "t0")].episode_advantage == 0.0
    rollouts[0].meta["final_score"] = float("nan")
    with pytest.raises(ValueError, match="final score must be a finite number"):
        GiGPO().assign(rollouts)
    with pytest.raises(ValueError, match="episode_stat must be one of"):
        GiGPO(episode_stat="tokens")  # type: ignore[arg-type]


def test_make_gigpo_passes_the_seed003_knobs() -> None:
    from ludic.training import make_gigpo

    credit = make_gigpo(default_step_reward=-0.01, episode_stat="step_rows").credit_assigner
    assert isinstance(credit, GiGPO)
    assert (credit.default_step_reward, credit.episode_stat) == (-0.01, "step_rows")
    assert GiGPO().episode_stat == "trajectory"  # the paper's equation is the default
