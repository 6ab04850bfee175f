"""AWR's learned-value baseline (cross-fitted) and its weight normalisations: hand-derived
values with fitters whose output is known, and the default MLP fitter on separable data."""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence

import pytest

from ludic.training import make_awr
from ludic.training.credit import AWRCredit
from ludic.training.credit.value import (
    MLPValueFitter,
    cross_fitted_values,
    fold_of,
    observation_features,
)
from ludic.types import AgentStep, EnvironmentStep, Rollout


def make_rollout(rewards: list[float], *, rid: str, group: str = "g") -> Rollout:
    """One turn per reward (turn ids t0, t1, ...; observation obs-k), the env reward on each."""
    steps: list[AgentStep | EnvironmentStep] = []
    for k, r in enumerate(rewards):
        a = AgentStep(turn_id=f"t{k}", info={"observation": f"obs-{k}"})
        steps += [a, EnvironmentStep(turn_id=f"t{k}", reward=r, agent_step_ids=(a.id,))]
    return Rollout(id=rid, steps=steps, meta={"group_id": group})


class MeanFitter:
    """Predicts the mean of its training targets; records what each fit saw."""

    def __init__(self) -> None:
        self.seen: list[list[float]] = []

    def __call__(self, features: Sequence[Sequence[Hashable]], targets: Sequence[float]):  # type: ignore[no-untyped-def]
        self.seen.append(list(targets))
        mean = sum(targets) / len(targets)
        return lambda rows: [mean] * len(rows)


def test_value_baseline_by_hand_with_two_folds() -> None:
    # a: rewards [0, 1] -> G = [1, 1]; b: [-1] -> G = [-1]. Two rollouts, two folds: each
    # rollout's value is the mean G of the other: V_a = -1, V_b = 1.
    # A = (1 - -1, 1 - -1, -1 - 1) = (2, 2, -2); beta 2: w = (e, e, 1/e)
    fitter = MeanFitter()
    credit = AWRCredit(baseline="value", beta=2.0, value_folds=2, fit_value=fitter)
    rollouts = [make_rollout([0.0, 1.0], rid="a"), make_rollout([-1.0], rid="b")]
    assert credit.advantages(rollouts) == pytest.approx(
        {("a", "t0"): 2.0, ("a", "t1"): 2.0, ("b", "t0"): -2.0}
    )
    assert sorted(map(sorted, fitter.seen)) == [[-1.0], [1.0, 1.0]]  # never its own return
    assert credit.assign(rollouts) == pytest.approx(
        {("a", "t0"): math.e, ("a", "t1"): math.e, ("b", "t0"): 1 / math.e}
    )


def test_cross_fitting_never_shows_a_rollout_its_own_return() -> None:
    ids = [f"r{i}" for i in range(7) for _ in range(2)]  # 7 rollouts of 2 turns each
    targets = [float(i) for i in range(14)]
    fold = fold_of(ids, 3, seed=0)
    assert sorted(fold.values()) == [0, 0, 0, 1, 1, 2, 2]  # dealt round-robin: sizes 3, 2, 2
    values = cross_fitted_values(ids, [[]] * 14, targets, folds=3, fit=MeanFitter(), seed=0)
    for i, rid in enumerate(ids):
        others = [t for j, t in zip(ids, targets, strict=True) if fold[j] != fold[rid]]
        assert values[i] == pytest.approx(sum(others) / len(others))
    assert fold_of(ids, 3, seed=0) == fold  # deterministic
    # the order decides, not the ids (random uuids in real data): renamed, same folds
    renamed = [f"z{9 - int(rid[1:])}" for rid in ids]
    by_new_name = fold_of(renamed, 3, seed=0)
    assert [by_new_name[r] for r in renamed] == [fold[r] for r in ids]


def test_a_long_cross_fit_says_how_far_it_is_after_each_fold(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import ludic.training.credit.value as value_module

    ids = [f"r{i}" for i in range(6)]
    clock = iter(range(0, 1000, 4))  # each fold's fit takes 4 s on this clock
    monkeypatch.setattr(value_module.time, "monotonic", lambda: float(next(clock)))
    with caplog.at_level(logging.INFO, logger="ludic.training.credit.value"):
        cross_fitted_values(ids, [[]] * 6, [1.0] * 6, folds=3, fit=MeanFitter(), seed=0)
    said = [r.getMessage().split(" (one fit")[0] for r in caplog.records]
    # quiet while under QUIET_S (fold 1 at 4 s), then one line per fold: a warning, which the
    # CLI prints (it shows no INFO lines), naming the flag that shortens it
    assert said == [
        "value baseline: fold 2 of 3 fitted (4 turns) after 8 s",
        "value baseline: fold 3 of 3 fitted (4 turns) after 12 s",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
    assert "--awr-value-folds" in caplog.records[0].getMessage()


def test_value_baseline_refuses_too_few_rollouts_and_folds() -> None:
    with pytest.raises(ValueError, match="value_folds must be >= 2"):
        AWRCredit(baseline="value", value_folds=1)
    credit = AWRCredit(baseline="value", value_folds=3, fit_value=MeanFitter())
    with pytest.raises(ValueError, match="2 rollouts cannot be split into 3 folds"):
        credit.assign([make_rollout([1.0], rid="a"), make_rollout([0.0], rid="b")])


def test_mlp_value_fitter_learns_a_separable_value_and_is_deterministic() -> None:
    fitter = MLPValueFitter(epochs=200, weight_decay=0.0)
    predict = fitter([["x"], ["y"]] * 5, [1.0, -1.0] * 5)
    assert predict([["x"], ["y"], ["x", "unseen"]]) == pytest.approx([1.0, -1.0, 1.0], abs=0.1)
    # with a state id per row, "x" / "y" still carry the value to states never seen
    rows = [["x", "s1"], ["x", "s2"], ["y", "s3"], ["y", "s4"]] * 5
    targets = [1.0, 1.0, -1.0, -1.0] * 5
    x_new, y_new = fitter(rows, targets)([["x", "new"], ["y", "new"]])
    assert x_new > 0.3 and y_new < -0.3
    assert fitter(rows, targets)([["x"], ["y"]]) == [x_new, y_new]  # deterministic
    with pytest.raises(ValueError, match="no training turns"):
        fitter([], [])


def test_observation_features_are_the_state_and_the_characters_by_position() -> None:
    turn = make_rollout([0.0], rid="a").turns()[0]
    features = observation_features(turn)
    assert features[0][0] == "state"
    assert features[1:] == [("char", i, c) for i, c in enumerate("obs-0")]
    assert observation_features(turn, max_chars=2)[1:] == [("char", 0, "o"), ("char", 1, "b")]


def test_normalize_mean_and_min_weight_by_hand() -> None:
    # one group, returns 1 and 0: A = +-0.5, beta 0.5: w = (e, 1/e), mean m = (e + 1/e) / 2
    rollouts = [make_rollout([1.0], rid="a"), make_rollout([0.0], rid="b")]
    m = (math.e + 1 / math.e) / 2
    plain = AWRCredit(beta=0.5, normalize_mean=True).assign(rollouts)
    assert plain == pytest.approx({("a", "t0"): math.e / m, ("b", "t0"): 1 / math.e / m})
    # 1/e / m = 0.238 < 0.5: floored
    floored = AWRCredit(beta=0.5, normalize_mean=True, min_weight=0.5).assign(rollouts)
    assert floored == pytest.approx({("a", "t0"): math.e / m, ("b", "t0"): 0.5})
    # mean over the trained turns only (b left out): a weighs 1, b is divided by a's weight
    only_a = AWRCredit(beta=0.5, normalize_mean=True, trained=lambda r, t: r.id == "a")
    assert only_a.assign(rollouts) == pytest.approx({("a", "t0"): 1.0, ("b", "t0"): math.e**-2})
    # the floor alone, and the cap after normalising
    assert AWRCredit(beta=0.5, min_weight=0.5).assign(rollouts) == pytest.approx(
        {("a", "t0"): math.e, ("b", "t0"): 0.5}
    )
    capped = AWRCredit(beta=0.5, max_weight=1.5, normalize_mean=True).assign(rollouts)
    assert capped == pytest.approx(
        {("a", "t0"): 1.5, ("b", "t0"): 1 / math.e / ((1.5 + 1 / math.e) / 2)}
    )
    with pytest.raises(ValueError, match="min_weight must be in"):
        AWRCredit(min_weight=30.0)


def test_make_awr_passes_the_value_and_normalisation_options() -> None:
    fitter = MeanFitter()
    credit = make_awr(
        baseline="value",
        value_folds=3,
        value_seed=4,
        fit_value=fitter,
        normalize_mean=True,
        min_weight=0.25,
    ).credit_assigner
    assert isinstance(credit, AWRCredit)
    assert (credit.baseline, credit.value_folds, credit.value_seed) == ("value", 3, 4)
    assert credit.fit_value is fitter
    assert (credit.normalize_mean, credit.min_weight) == (True, 0.25)
