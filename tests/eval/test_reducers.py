"""Reducers: pass@k against brute-force enumeration, dotted paths, rates, naming."""

from __future__ import annotations

import itertools
import math

import pytest

from ludic.eval import (
    Count,
    EpisodeRecord,
    Mean,
    MeanAtK,
    PassAtK,
    Rates,
    episode_outcome,
    pass_at_k,
    reduce_metrics,
)
from ludic.types import EnvironmentStep, Rollout


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the C(n, k) k-subsets of n samples (c correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_enumeration(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = brute_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
            # and the closed form 1 - C(n-c, k) / C(n, k)
            assert expected == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="at least k=3 samples"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        PassAtK(k=0)


def ep(i: int, group: str, reward: float, **kw: object) -> EpisodeRecord:
    return EpisodeRecord(
        rollout_id=f"r{i}", agent_id="agent_0", group_id=group, total_reward=reward, **kw
    )  # type: ignore[arg-type]


def test_mean_dotted_path_rates_and_naming() -> None:
    eps = [
        ep(0, "a", 1.0, success=True, outcome="Win", meta={"difficulty": 2}),
        ep(1, "a", 0.0, outcome="loss", meta={"difficulty": 4}),
        ep(2, "b", 0.5, outcome="win", failed=True, meta={}),
    ]
    metrics = reduce_metrics(
        {
            "difficulty": Mean(path="meta.difficulty"),
            "reward": Mean(path="total_reward"),
            "reward_ok": Mean(path="total_reward", skip_failed=True),
            "outcome": Rates(),
            "n": Count(),
            "n_success": Count(where=lambda e: e.success),
            "missing": Mean(path="meta.nope"),
            "mean@1": MeanAtK(k=1),
        },
        eps,
    )
    assert metrics == {
        "difficulty": 3.0,
        "reward": 0.5,
        "reward_ok": 0.5,
        "outcome/win": 2 / 3,
        "outcome/loss": 1 / 3,
        "n": 3.0,
        "n_success": 1.0,
        "mean@1": (0.5 + 0.5) / 2,  # group a: mean(1, 0); group b: 0.5
    }


def test_pass_at_k_groups_by_problem_and_agent() -> None:
    eps = [
        EpisodeRecord(rollout_id="1", agent_id="x", group_id="g", success=True),
        EpisodeRecord(rollout_id="2", agent_id="x", group_id="g", success=False),
        EpisodeRecord(rollout_id="3", agent_id="o", group_id="g", success=False),
        EpisodeRecord(rollout_id="4", agent_id="o", group_id="g", success=False),
    ]
    # seat x: n=2, c=1 -> pass@2 = 1; seat o: n=2, c=0 -> 0
    assert PassAtK(k=2)(eps) == pytest.approx(0.5)
    assert PassAtK(k=1)(eps) == pytest.approx(0.25)


def test_episode_outcome_order() -> None:
    env = EnvironmentStep(terminated=True, reward=1.0, info={"result": "draw"})
    assert episode_outcome(Rollout(steps=[env]), success=True) == "draw"
    plain = EnvironmentStep(terminated=True, reward=1.0)
    assert episode_outcome(Rollout(steps=[plain]), success=True) == "success"
    assert episode_outcome(Rollout(steps=[plain]), success=False) == "failure"
    cut = Rollout(steps=[plain], meta={"episode_truncated": True})
    assert episode_outcome(cut, success=False) == "truncated"
    assert episode_outcome(Rollout(meta={"error": "boom"}), success=False) == "error"
    graded = EnvironmentStep(terminated=True, info={"correct": False})
    assert episode_outcome(Rollout(steps=[graded]), success=False) == "incorrect"
