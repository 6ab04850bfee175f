"""AWR's learned Q - V baseline (`AWRCredit(baseline="q_value")`): a hand-computed case with a
tabular fitter, the default action features, and the default MLP fitter telling a good move
in a lost game from a bad move in a won one."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import pytest

from ludic.training import make_awr
from ludic.training.credit import AWRCredit
from ludic.training.credit.value import action_features, observation_features
from ludic.types import AgentStep, EnvironmentStep, Rollout


def one_move(action: str, reward: float, *, rid: str) -> Rollout:
    """An episode of one turn from the same observation: `action`, then `reward`."""
    a = AgentStep(turn_id="t0", info={"observation": "board"})
    env = EnvironmentStep(turn_id="t0", action=action, reward=reward, agent_step_ids=(a.id,))
    return Rollout(id=rid, steps=[a, env])


class TabularFitter:
    """Predicts the mean training target of the rows with the same features (unseen: the
    mean of all), i.e. Monte Carlo by counting."""

    def __call__(self, features: Sequence[Sequence[Hashable]], targets: Sequence[float]):  # type: ignore[no-untyped-def]
        by_row: dict[tuple[Hashable, ...], list[float]] = defaultdict(list)
        for row, target in zip(features, targets, strict=True):
            by_row[tuple(row)].append(target)
        mean = sum(targets) / len(targets)
        return lambda rows: [
            sum(by_row[tuple(r)]) / len(by_row[tuple(r)]) if tuple(r) in by_row else mean
            for r in rows
        ]


# good: won 2 of 3; bad: won 1 of 3
DATA = [("good", -1.0), ("good", 1.0), ("bad", 1.0), ("bad", -1.0), ("good", 1.0), ("bad", -1.0)]


def test_q_value_baseline_by_hand_with_one_rollout_per_fold() -> None:
    # 6 rollouts, 6 folds: each turn's Q and V are fitted on the 5 other rollouts.
    # a (good, lost): V = (1 + 1 - 1 + 1 - 1) / 5 = 0.2, Q(good) = mean(1, 1) = 1 -> A = +0.8
    # c (bad, won):   V = (-1 + 1 - 1 + 1 - 1) / 5 = -0.2, Q(bad) = mean(-1, -1) = -1 -> -0.8
    # b (good, won):  V = (-1 + 1 - 1 + 1 - 1) / 5 = -0.2, Q(good) = mean(-1, 1) = 0 -> +0.2
    # d (bad, lost):  V = (-1 + 1 + 1 + 1 - 1) / 5 = 0.2, Q(bad) = mean(1, -1) = 0 -> -0.2
    rollouts = [one_move(a, r, rid=rid) for (a, r), rid in zip(DATA, "abcdef", strict=True)]
    credit = AWRCredit(baseline="q_value", beta=0.5, value_folds=6, fit_value=TabularFitter())
    advantages = credit.advantages(rollouts)
    expected = {"a": 0.8, "b": 0.2, "c": -0.8, "d": -0.2, "e": 0.2, "f": -0.2}
    assert advantages == pytest.approx({(rid, "t0"): a for rid, a in expected.items()})
    # G - V (baseline "value") scores the lost good move below the won bad one: q_value does not
    value = AWRCredit(baseline="value", value_folds=6, fit_value=TabularFitter())
    plain = value.advantages(rollouts)
    assert plain[("a", "t0")] == pytest.approx(-1.2) and plain[("c", "t0")] == pytest.approx(1.2)
    weights = credit.assign(rollouts)
    assert weights[("a", "t0")] == pytest.approx(2.718281828**1.6, rel=1e-6)


def test_action_features_are_the_observation_features_and_the_action() -> None:
    turn = one_move("good", 1.0, rid="a").turns()[0]
    assert action_features(turn) == [*observation_features(turn), ("action", "good")]
    no_env = Rollout(steps=[AgentStep(turn_id="t0", info={"observation": "x"})]).turns()[0]
    assert action_features(no_env) == observation_features(no_env)


def test_default_mlp_q_value_scores_the_move_not_the_outcome() -> None:
    # 30 episodes from one observation: the good move wins 4 of 5, the bad one loses 4 of 5.
    rows = ([("good", 1.0)] * 4 + [("good", -1.0)] + [("bad", -1.0)] * 4 + [("bad", 1.0)]) * 3
    rollouts = [one_move(a, r, rid=f"r{i}") for i, (a, r) in enumerate(rows)]
    credit = make_awr(baseline="q_value", value_folds=3).credit_assigner
    assert isinstance(credit, AWRCredit)
    advantages = credit.advantages(rollouts)
    by_kind: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for rollout, (action, reward) in zip(rollouts, rows, strict=True):
        by_kind[(action, reward > 0)].append(advantages[(rollout.id, "t0")])
    assert min(by_kind[("good", False)]) > 0.2  # a good move in a lost game
    assert max(by_kind[("bad", True)]) < -0.2  # a bad move in a won game


def test_make_awr_passes_the_action_featurizer() -> None:
    def feats(turn: object) -> list[Hashable]:
        return ["x"]

    credit = make_awr(baseline="q_value", featurize_action=feats).credit_assigner
    assert isinstance(credit, AWRCredit)
    assert (credit.baseline, credit.featurize_action) == ("q_value", feats)
    with pytest.raises(ValueError, match="baseline must be one of"):
        AWRCredit(baseline="q")  # type: ignore[arg-type]
