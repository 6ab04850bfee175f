"""RLOO, REINFORCE++ (with and without the group baseline) and AWR credit: hand-derived
weights per turn, and the presets that use them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ludic.training import make_awr, make_reinforce_pp, make_rloo
from ludic.training.credit import (
    AWRCredit,
    LeaveOneOutReturn,
    ReinforcePlusPlus,
    awr_weights,
    leave_one_out,
    whiten,
)
from ludic.training.losses import ReinforceLoss, TokenClippedSurrogateLoss
from ludic.types import AgentStep, EnvironmentStep, Rollout


def make_rollout(rewards: list[float], *, rid: str, group: str | None = "g") -> Rollout:
    """One turn per reward (turn ids t0, t1, ...), the env reward on each turn."""
    steps: list[AgentStep | EnvironmentStep] = []
    for k, r in enumerate(rewards):
        a = AgentStep(turn_id=f"t{k}", info={"observation": f"obs-{k}"})
        steps += [a, EnvironmentStep(turn_id=f"t{k}", reward=r, agent_step_ids=(a.id,))]
    return Rollout(id=rid, steps=steps, meta={} if group is None else {"group_id": group})


def group(returns: list[float], name: str = "g") -> list[Rollout]:
    return [make_rollout([r], rid=f"{name}{i}", group=name) for i, r in enumerate(returns)]


def test_leave_one_out_by_hand() -> None:
    # R = [1, 0, 2]: A_0 = 1 - (0 + 2)/2 = 0, A_1 = 0 - (1 + 2)/2 = -1.5, A_2 = 2 - 0.5 = 1.5
    assert leave_one_out([1.0, 0.0, 2.0]) == pytest.approx([0.0, -1.5, 1.5], abs=1e-12)
    assert leave_one_out([3.0]) == [0.0]  # nobody to compare with
    weights = LeaveOneOutReturn().assign([*group([1.0, 0.0, 2.0]), *group([4.0], "h")])
    assert weights == pytest.approx(
        {("g0", "t0"): 0.0, ("g1", "t0"): -1.5, ("g2", "t0"): 1.5, ("h0", "t0"): 0.0}, abs=1e-12
    )


def test_rloo_differs_from_the_group_mean_by_g_over_g_minus_1() -> None:
    # mean 1, R - mean = (0, -1, 1); RLOO = 3/2 * that
    rloo = leave_one_out([1.0, 0.0, 2.0])
    assert rloo == pytest.approx([1.5 * c for c in (0.0, -1.0, 1.0)], abs=1e-12)


def test_whiten_by_hand() -> None:
    # [1, 1, 0]: mean 2/3, centred (1/3, 1/3, -2/3), sample var (1/9 + 1/9 + 4/9) / 2 = 1/3
    s = math.sqrt(1.0 / 3.0)
    assert whiten([1.0, 1.0, 0.0], eps=0.0) == pytest.approx([1 / 3 / s, 1 / 3 / s, -2 / 3 / s])
    assert whiten([5.0], eps=1e-8) == [0.0]


def test_reinforce_pp_whitens_returns_to_go_over_the_batch() -> None:
    # rollout a: rewards [0, 1] -> returns-to-go [1, 1]; rollout b: [0] -> [0] (other group)
    # batch values [1, 1, 0]: whitened as in test_whiten_by_hand (+ eps 1e-8 in the variance)
    rollouts = [make_rollout([0.0, 1.0], rid="a", group="g"), make_rollout([0.0], rid="b")]
    rollouts[1].meta["group_id"] = "h"
    s = math.sqrt(1.0 / 3.0 + 1e-8)
    assert ReinforcePlusPlus().assign(rollouts) == pytest.approx(
        {("a", "t0"): 1 / 3 / s, ("a", "t1"): 1 / 3 / s, ("b", "t0"): -2 / 3 / s}, abs=1e-9
    )


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_whitens() -> None:
    # group g: R = [1, 0, 2] -> R - mean = [0, -1, 1]; group h: [5, 5] -> [0, 0]
    # whiten [0, -1, 1, 0, 0]: mean 0, sample var 2 / 4 = 0.5 -> divide by sqrt(0.5 + 1e-8)
    weights = ReinforcePlusPlus(group_baseline=True).assign(
        [*group([1.0, 0.0, 2.0]), *group([5.0, 5.0], "h")]
    )
    s = math.sqrt(0.5 + 1e-8)
    expected = {("g0", "t0"): 0.0, ("g1", "t0"): -1 / s, ("g2", "t0"): 1 / s}
    expected |= {("h0", "t0"): 0.0, ("h1", "t0"): 0.0}
    assert weights == pytest.approx(expected, abs=1e-9)


def test_awr_group_baseline_by_hand() -> None:
    # R = [1, 0, 2] -> A = [0, -1, 1]; beta 0.5: exp(0) = 1, exp(-2), exp(2) = 7.389 capped at 5
    weights = AWRCredit(beta=0.5, max_weight=5.0).assign(group([1.0, 0.0, 2.0]))
    assert weights == pytest.approx(
        {("g0", "t0"): 1.0, ("g1", "t0"): math.exp(-2.0), ("g2", "t0"): 5.0}, abs=1e-12
    )


def test_awr_mean_baseline_by_hand() -> None:
    # returns-to-go [1, 1] and [0]; dataset mean 2/3 -> A = [1/3, 1/3, -2/3]; beta 1
    rollouts = [make_rollout([0.0, 1.0], rid="a", group=None), make_rollout([0.0], rid="b")]
    weights = AWRCredit(baseline="mean").assign(rollouts)
    third = math.exp(1 / 3)
    assert weights == pytest.approx(
        {("a", "t0"): third, ("a", "t1"): third, ("b", "t0"): math.exp(-2 / 3)}, abs=1e-12
    )


def test_awr_state_baseline_by_hand() -> None:
    # returns-to-go: a [1, 1], b [0], c [0, 0]; turn k of each acts from state "obs-k".
    # mean G = 2/5 = 0.4; V excludes the turn itself, plus 1 pseudo-visit of the mean:
    # obs-0 holds G 1 (a), 0 (b), 0 (c): a: V = (0 + 0 + 0.4) / 3, b and c: (1 + 0 + 0.4) / 3
    # obs-1 holds G 1 (a), 0 (c): a: V = (0 + 0.4) / 2 = 0.2, c: (1 + 0.4) / 2 = 0.7
    rollouts = [
        make_rollout([0.0, 1.0], rid="a"),
        make_rollout([0.0], rid="b"),
        make_rollout([0.0, 0.0], rid="c"),
    ]
    advantages = AWRCredit(baseline="state").advantages(rollouts)
    assert advantages == pytest.approx(
        {
            ("a", "t0"): 1 - 0.4 / 3,
            ("b", "t0"): -1.4 / 3,
            ("c", "t0"): -1.4 / 3,
            ("a", "t1"): 1 - 0.2,
            ("c", "t1"): -0.7,
        },
        abs=1e-12,
    )
    weights = AWRCredit(baseline="state", beta=0.5, max_weight=3.0).assign(rollouts)
    assert weights[("a", "t0")] == 3.0  # exp(2 * 0.867) = 5.66, capped
    assert weights[("c", "t1")] == pytest.approx(math.exp(-1.4))
    # a state seen once falls back to the data mean: A = G - mean (the "mean" baseline)
    lone = [make_rollout([2.0], rid="x"), make_rollout([0.0, 0.0], rid="y")]
    lone[1].steps[0].info["observation"] = "elsewhere"  # type: ignore[union-attr]
    mean = (2.0 + 0.0 + 0.0) / 3
    by_state = AWRCredit(baseline="state").advantages(lone)
    assert by_state[("x", "t0")] == pytest.approx(2.0 - mean)
    assert by_state[("y", "t1")] == pytest.approx(0.0 - mean)
    with pytest.raises(ValueError, match="state_prior"):
        AWRCredit(baseline="state", state_prior=0.0)


def one_move(rid: str, action: str, reward: float) -> Rollout:
    """A one-turn episode: `action` from the state "obs-0", then `reward`."""
    a = AgentStep(turn_id="t0", info={"observation": "obs-0"})
    env = EnvironmentStep(turn_id="t0", action=action, reward=reward, agent_step_ids=(a.id,))
    return Rollout(id=rid, steps=[a, env], meta={})


def test_awr_state_action_baseline_by_hand() -> None:
    # one state; move "5" returned 1 and 1, move "1" returned 1, 0 and -1 (a lucky win).
    # mean G = 2/5 = 0.4; V = (2 + 0.4) / (5 + 1) = 0.4 (one pseudo-visit of the mean);
    # Q(5) = (1 + 1 + 0.4) / (2 + 1) = 0.8, Q(1) = (1 + 0 - 1 + 0.4) / (3 + 1) = 0.1
    rollouts = [
        one_move("p", "5", 1.0),
        one_move("q", "5", 1.0),
        one_move("r", "1", 1.0),
        one_move("s", "1", 0.0),
        one_move("t", "1", -1.0),
    ]
    advantages = AWRCredit(baseline="state_action").advantages(rollouts)
    assert advantages == pytest.approx(
        {
            ("p", "t0"): 0.4,
            ("q", "t0"): 0.4,
            ("r", "t0"): -0.3,
            ("s", "t0"): -0.3,
            ("t", "t0"): -0.3,
        },
        abs=1e-12,
    )
    # the "state" baseline credits the lucky win instead: 1 - (1 + 1 + 0 - 1 + 0.4) / 5
    assert AWRCredit(baseline="state").advantages(rollouts)[("r", "t0")] == pytest.approx(0.72)
    weights = AWRCredit(baseline="state_action", beta=0.5, max_weight=2.0).assign(rollouts)
    assert weights[("p", "t0")] == pytest.approx(min(math.exp(0.8), 2.0))
    assert weights[("r", "t0")] == pytest.approx(math.exp(-0.6))
    # two pseudo-visits: V = (2 + 0.8) / 7 = 0.4, Q(5) = (2 + 0.8) / 4 = 0.7
    shrunk = AWRCredit(baseline="state_action", state_prior=2.0).advantages(rollouts)
    assert shrunk[("p", "t0")] == pytest.approx(0.3)


def test_awr_state_normalize_keeps_each_state_at_mean_weight_one() -> None:
    rollouts = [
        one_move("p", "5", 1.0),
        one_move("q", "5", 1.0),
        one_move("r", "1", 1.0),
        one_move("s", "1", 0.0),
        one_move("t", "1", -1.0),
        make_rollout([3.0], rid="lone"),  # moved to a state of its own below
    ]
    rollouts[-1].steps[0].info["observation"] = "elsewhere"  # type: ignore[union-attr]
    credit = AWRCredit(baseline="state_action", beta=0.5)
    raw = credit.assign(rollouts)
    normalized = replace(credit, state_normalize=True).assign(rollouts)
    # obs-0: raw weights e^(A / 0.5) with A from the six turns; divided by their mean
    obs0 = [("p", "t0"), ("q", "t0"), ("r", "t0"), ("s", "t0"), ("t", "t0")]
    mean = sum(raw[k] for k in obs0) / 5
    for key in obs0:
        assert normalized[key] == pytest.approx(raw[key] / mean)
    assert sum(normalized[k] for k in obs0) == pytest.approx(5.0)
    assert normalized[("p", "t0")] / normalized[("r", "t0")] == pytest.approx(
        raw[("p", "t0")] / raw[("r", "t0")]
    )
    assert raw[("lone", "t0")] != pytest.approx(1.0)
    assert normalized[("lone", "t0")] == pytest.approx(1.0)  # a state seen once weighs 1


def retry_game(rid: str, reward: float) -> Rollout:
    """An illegal move from "obs-0" (-1, the agent tries again from the same board), then
    move "5" from "obs-0" ending the game with `reward`."""
    a0 = AgentStep(turn_id="t0", info={"observation": "obs-0"})
    e0 = EnvironmentStep(turn_id="t0", action="1", reward=-1.0, agent_step_ids=(a0.id,))
    a1 = AgentStep(turn_id="t1", info={"observation": "obs-0"})
    e1 = EnvironmentStep(turn_id="t1", action="5", reward=reward, agent_step_ids=(a1.id,))
    return Rollout(id=rid, steps=[a0, e0, a1, e1], meta={})


def test_awr_state_normalize_counts_only_the_trained_turns() -> None:
    # one state "obs-0": game r: illegal "1" (-1) then "5" (+1): G = 0, 1; game p: "5" (+1).
    # mean G = 2/3; "mean" baseline: A = G - 2/3; beta = 1: raw w = e^(-2/3), e^(1/3), e^(1/3)
    rollouts = [retry_game("r", 1.0), one_move("p", "5", 1.0)]
    raw = {
        ("r", "t0"): math.exp(-2 / 3),
        ("r", "t1"): math.exp(1 / 3),
        ("p", "t0"): math.exp(1 / 3),
    }
    credit = AWRCredit(baseline="mean", beta=1.0)
    assert credit.assign(rollouts) == pytest.approx(raw, abs=1e-12)
    # every turn counted: mean (e^(-2/3) + 2 e^(1/3)) / 3 = 1.1199...; the two kept moves
    # then weigh e^(1/3) / 1.1199 = 1.2375 each, not 1 (the bug the `trained` rule fixes)
    everything = replace(credit, state_normalize=True).assign(rollouts)
    all_mean = (math.exp(-2 / 3) + 2 * math.exp(1 / 3)) / 3
    assert everything[("p", "t0")] == pytest.approx(math.exp(1 / 3) / all_mean)
    assert everything[("p", "t0")] > 1.2
    # the retry turn left out (reward < 0, as drop_penalised_turns): the kept turns' mean is
    # e^(1/3), so each kept move weighs exactly 1 and the state keeps its share of 2 turns
    legal = replace(credit, state_normalize=True, trained=lambda _r, turn: turn.reward >= 0)
    kept = legal.assign(rollouts)
    assert kept[("r", "t1")] == pytest.approx(1.0, abs=1e-12)
    assert kept[("p", "t0")] == pytest.approx(1.0, abs=1e-12)
    assert kept[("r", "t0")] == pytest.approx(math.exp(-2 / 3) / math.exp(1 / 3))  # = e^-1
    # a state whose turns are all left out keeps its raw weights; so does the make_awr preset
    none = replace(legal, trained=lambda _r, _t: False).assign(rollouts)
    assert none == pytest.approx(raw, abs=1e-12)
    preset = make_awr(baseline="mean", state_normalize=True, trained=legal.trained)
    assert preset.credit_assigner == legal


def test_awr_weights_never_overflow_and_bad_settings_are_refused() -> None:
    assert awr_weights([1e6, -1e6], beta=1e-3, max_weight=20.0) == [20.0, 0.0]
    with pytest.raises(ValueError, match="beta must be"):
        AWRCredit(beta=0.0)
    with pytest.raises(ValueError, match="max_weight"):
        AWRCredit(max_weight=math.inf)
    with pytest.raises(ValueError, match="baseline must be one of"):
        AWRCredit(baseline="critic")  # type: ignore[arg-type]


def test_presets_pair_the_credit_with_its_loss() -> None:
    rloo = make_rloo()
    assert isinstance(rloo.credit_assigner, LeaveOneOutReturn)
    assert isinstance(rloo.loss, ReinforceLoss)
    pp, ppb = make_reinforce_pp(), make_reinforce_pp(group_baseline=True)
    assert (pp.name, ppb.name) == ("reinforce_pp", "reinforce_pp_baseline")
    assert isinstance(ppb.credit_assigner, ReinforcePlusPlus)
    assert ppb.credit_assigner.group_baseline and not pp.credit_assigner.group_baseline  # type: ignore[attr-defined]
    assert isinstance(pp.loss, TokenClippedSurrogateLoss)
    awr = make_awr(beta=0.5, baseline="mean")
    assert awr.name == "awr" and isinstance(awr.loss, ReinforceLoss)
    assert awr.credit_assigner == AWRCredit(beta=0.5, baseline="mean")
