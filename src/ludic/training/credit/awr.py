"""Advantage-weighted regression credit (Peng et al. 2019, arXiv:1910.00177):

    w = min(exp(A / beta), max_weight)

with A an advantage of each turn's return. The weight multiplies the turn's log-likelihood
(`ReinforceLoss`), so AWR is weighted SFT on stored rollouts: good turns count more, bad ones
less, none negatively. No value network shares the policy (the paper trains a critic); the
baselines are the group mean, the mean over the rollouts given to `assign`, or a tabular
Monte Carlo value of the turn's state (its anchor key, as GiGPO's) learnt from the other visits
of that state in the data, which can tell a good move from a bad one inside one episode, or
tabular Monte Carlo Q(s, a) - V(s) ("state_action": every visit of the same move from the same
state shares one advantage, so the noise of single returns averages out when pairs repeat), or
a learned value ("value", the paper's V: a small model fitted on the stored returns-to-go,
cross-fitted over folds of rollouts; see `ludic.training.credit.value`), which gives a
baseline to states seen once from the states that resemble them, or learned Q(s, a) - V(s)
("q_value": two such models, Q over features of the state and the move, e.g. the position the
move leads to, an afterstate, which many (state, move) pairs share, so a move's value is learnt
from every game that reached the same position, whichever way).
The weights can be renormalised (per state, or to mean 1 over the trained turns) and floored.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Literal

from ludic.rollouts.samples import TurnKey
from ludic.training.credit.core import (
    AnchorKey,
    AnchorKeyFn,
    active_rollouts,
    check_eps,
    check_gamma,
    default_anchor_key,
    discounted_returns,
    group_normalize,
    group_rollouts,
    turn_key,
)
from ludic.training.credit.value import (
    DEFAULT_VALUE_FITTER,
    Featurizer,
    ValueFitter,
    action_features,
    cross_fitted_values,
    observation_features,
)
from ludic.training.option_warnings import warn_unread_option
from ludic.types import Rollout, Turn

AWRBaseline = Literal["group", "mean", "state", "state_action", "value", "q_value"]
# Whether a turn of a rollout will be trained (see `AWRCredit.trained`).
TurnPredicate = Callable[[Rollout, Turn], bool]
_BASELINES: tuple[str, ...] = ("group", "mean", "state", "state_action", "value", "q_value")
BASELINE_OPTIONS: dict[str, tuple[AWRBaseline, ...]] = {
    "state_prior": ("state", "state_action"),
    "value_folds": ("value", "q_value"),
    "value_seed": ("value", "q_value"),
    "featurize": ("value", "q_value"),
    "featurize_action": ("q_value",),
    "fit_value": ("value", "q_value"),
}
"""The `AWRCredit` options only some baselines read, and the baselines that read each; any
other baseline ignores it, so `AWRCredit` (and `make_awr`) warns when one is given there: set
to a value other than its default (see `warn_unread_baseline_options`)."""
# (turn key, return-to-go G, state, action): one turn as the per-turn baselines read it.
TurnReturn = tuple[TurnKey, float, AnchorKey | None, str | None]


def state_advantages(
    turns: Sequence[TurnReturn], *, mean: float, prior: float
) -> dict[TurnKey, float]:
    """A_k = G_k - V_{-k}(s_k) (see `AWRCredit`, baseline "state"); a turn without a state
    (None) gets G_k - mean."""
    totals: dict[AnchorKey, tuple[float, int]] = defaultdict(lambda: (0.0, 0))
    for _, g, state, _ in turns:
        if state is not None:
            total, count = totals[state]
            totals[state] = (total + g, count + 1)
    out: dict[TurnKey, float] = {}
    for key, g, state, _ in turns:
        if state is None:
            out[key] = g - mean
            continue
        total, count = totals[state]
        out[key] = g - (total - g + prior * mean) / (count - 1 + prior)
    return out


def state_action_advantages(
    turns: Sequence[TurnReturn], *, mean: float, prior: float
) -> dict[TurnKey, float]:
    """A_k = Q(s_k, a_k) - V(s_k) (see `AWRCredit`, baseline "state_action"); a turn without
    a state (None) gets G_k - mean."""
    by_state: dict[AnchorKey, list[float]] = defaultdict(list)
    by_pair: dict[tuple[AnchorKey, str | None], list[float]] = defaultdict(list)
    for _, g, state, action in turns:
        if state is not None:
            by_state[state].append(g)
            by_pair[(state, action)].append(g)
    values = {s: (math.fsum(gs) + prior * mean) / (len(gs) + prior) for s, gs in by_state.items()}
    out: dict[TurnKey, float] = {}
    for key, g, state, action in turns:
        if state is None:
            out[key] = g - mean
            continue
        gs = by_pair[(state, action)]
        q = (math.fsum(gs) + prior * values[state]) / (len(gs) + prior)
        out[key] = q - values[state]
    return out


def unread_baseline_options(baseline: str, given: Mapping[str, object]) -> list[str]:
    """The options of `given` (passed, by name) that `baseline` never reads, in order."""
    return [
        option
        for option in given
        if option in BASELINE_OPTIONS and baseline not in BASELINE_OPTIONS[option]
    ]


class UnreadAWROptionError(ValueError):
    """An AWR option (`option`) given with a `baseline` that never reads it, raised by
    `check_baseline_options` (a command line's check: a typed flag that does nothing is surely a
    mistake; the library only warns); `readers` are the baselines that read it."""

    def __init__(self, option: str, value: object, baseline: str) -> None:
        self.option = option
        self.baseline = baseline
        self.readers = BASELINE_OPTIONS[option]
        shown = getattr(value, "__name__", None) or repr(value)  # a function by its name
        super().__init__(
            f"AWRCredit: {option}={shown} applies only to baseline "
            f"{' or '.join(map(repr, self.readers))}, not {baseline!r} (which would ignore it): "
            f"drop it or pass baseline={self.readers[0]!r}"
        )


def check_baseline_options(baseline: str, given: Mapping[str, object]) -> None:
    """Raise `UnreadAWROptionError` for the first option of `given` that `baseline` never
    reads: for a command line (`ludic sft`), which names the flag; `make_awr` and `AWRCredit`
    only warn (`warn_unread_baseline_options`)."""
    unread = unread_baseline_options(baseline, given)
    if unread:
        raise UnreadAWROptionError(unread[0], given[unread[0]], baseline)


def warn_unread_baseline_options(baseline: str, given: Mapping[str, object]) -> None:
    """An `UnreadOptionWarning` for each option of `given` that `baseline` never reads, naming
    the baselines that read it. A warning, not an error: a grid over AWR baselines passes every
    baseline's options to every arm; a value no baseline could use is refused by the range
    checks of `AWRCredit` instead."""
    for option in unread_baseline_options(baseline, given):
        readers = BASELINE_OPTIONS[option]
        warn_unread_option(
            "AWRCredit",
            option,
            given[option],
            f"only baseline {' or '.join(map(repr, readers))} reads it, not {baseline!r} "
            f"(drop it, or pass baseline={readers[0]!r})",
        )


def awr_weights(advantages: Sequence[float], *, beta: float, max_weight: float) -> list[float]:
    """w_i = min(exp(A_i / beta), max_weight), computed so a huge A_i / beta cannot overflow."""
    log_cap = math.log(max_weight)
    return [max_weight if a / beta >= log_cap else math.exp(a / beta) for a in advantages]


@dataclass(frozen=True, kw_only=True, slots=True)
class AWRCredit:
    """AWR weights per turn: w = min(exp(A / beta), max_weight).

    baseline="group": A = R_i - mean_group(R) (divided by the group's std when `normalize_std`),
        R_i the episode return, groups as in `GroupNormalizedReturn` (group id, else the first
        observation); every turn of the episode shares it.
    baseline="mean":  A_k = G_k - mean(G) with G_k the turn's discounted return-to-go and the
        mean over every turn passed to `assign` (the whole dataset for `OfflineBatchSource`).
    baseline="state": A_k = G_k - V(s_k), V(s_k) the mean return-to-go of the OTHER turns taken
        from the same state (`anchor_key`: the env's state key, else the observation text)
        shrunk toward mean(G) with `state_prior` pseudo-visits:
        V = (sum_{j != k, s_j = s_k} G_j + state_prior * mean(G)) / (n_s - 1 + state_prior).
        A state seen once falls back to the "mean" baseline; a move that did worse than the
        others from its state gets A < 0 even in a won episode.
    baseline="state_action": A_k = Q(s_k, a_k) - V(s_k), tabular Monte Carlo: V(s) the mean
        return-to-go of every turn from s shrunk toward mean(G), Q(s, a) that of every turn that
        took action a (the env step's action) from s shrunk toward V(s), each with
        `state_prior` pseudo-visits:
        V = (sum_{s_j = s} G_j + state_prior * mean(G)) / (n_s + state_prior),
        Q = (sum_{s_j = s, a_j = a} G_j + state_prior * V) / (n_sa + state_prior).
        Every visit of (s, a) gets the same A, so one lucky game does not decide a move's
        weight; a pair seen once gets a shrunk episode-level advantage. This is the value the
        paper's critic approximates, estimated by counting (it needs repeated states).
    baseline="value": A_k = G_k - V_{-f(k)}(s_k), V a value model (`fit_value`, default a tiny
        MLP, `MLPValueFitter`) over each turn's features (`featurize`, default the state id and
        the observation's characters by position, `observation_features`) fitted to the
        returns-to-go G of the rollouts outside the turn's fold: the rollouts are dealt into
        `value_folds` folds (seeded by `value_seed`), so no turn's baseline saw its own return.
        A state seen once still gets a value, learnt from the states that look like it.
    baseline="q_value": A_k = Q_{-f(k)}(s_k, a_k) - V_{-f(k)}(s_k), both fitted as "value"
        does (same folds, same `fit_value`) on the returns-to-go: V over `featurize`, Q over
        `featurize_action` (default `action_features`: the state's features plus the action
        sent to the env). A turn's own return enters neither, so unlike G - V the noise of its
        game's outcome does not decide its sign: a good move in a lost game can weigh more than
        a bad move in a won one. It is as good as Q's features let it generalise; for board
        games give the position the move leads to (an afterstate, Sutton & Barto 6.8), shared
        by every (state, move) pair that reaches it (`examples/awr_tictactoe_weights.py`).
    state_normalize: divide each weight by the mean weight of the turns from its state (MPO's
        per-state normalisation of exp(A / beta)): every state keeps its share of the data, as
        in SFT on all of it, and only the choice among the moves from a state is reweighted (a
        state seen once weighs 1). Without it, states whose moves have large advantages take
        over the loss (fewer effective samples; see the README's AWR section).
    trained: with state_normalize, the turns that will be trained (True) - the mean of a state
        is taken over these only. Pass the turn-level form of the sample filters that drop turns
        after credit (e.g. penalised illegal moves, which share their state with the retry that
        follows): otherwise the dropped turns' small weights pull the mean down and the kept
        turns of that state weigh more than 1. A left-out turn is divided by its state's mean
        too (its own weight if no turn of its state is kept). None: every turn is trained.
    normalize_mean: after the above, divide every weight by the mean weight of the `trained`
        turns (all turns when `trained` is None): the trained turns keep the loss scale of SFT
        (mean weight 1) whatever beta does.
    min_weight: last (with normalize_mean or min_weight > 0), every weight is clipped to
        [min_weight, max_weight] (0: no floor), so no trained turn drops out of the loss entirely (e.g. min_weight=0.5 with
        normalize_mean: every turn keeps at least half of an average turn's weight).
    An option only some baselines read (`BASELINE_OPTIONS`: `state_prior`; the value models'
    `value_folds`, `value_seed`, `featurize`, `fit_value`; Q's `featurize_action`) set away from
    its default with a baseline that ignores it is named by an `UnreadOptionWarning` (once per
    option and value): it changes nothing, and a grid over baselines passes it to every arm.
    The paper uses beta = 0.05 on its returns and max_weight = 20; beta here defaults to 1.0
    for rewards in [-1, 1].
    """

    beta: float = 1.0
    max_weight: float = 20.0
    baseline: AWRBaseline = "group"
    normalize_std: bool = False
    gamma: float = 1.0
    eps: float = 1e-6
    state_prior: float = 1.0
    state_normalize: bool = False
    trained: TurnPredicate | None = None
    anchor_key: AnchorKeyFn = default_anchor_key
    value_folds: int = 5
    value_seed: int = 0
    featurize: Featurizer = observation_features
    featurize_action: Featurizer = action_features
    fit_value: ValueFitter = DEFAULT_VALUE_FITTER
    normalize_mean: bool = False
    min_weight: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"AWRCredit: beta must be a finite number > 0, got {self.beta}")
        if not (math.isfinite(self.max_weight) and self.max_weight > 0):
            raise ValueError(f"AWRCredit: max_weight must be finite and > 0, got {self.max_weight}")
        if self.baseline not in _BASELINES:
            raise ValueError(
                f"AWRCredit: baseline must be one of {_BASELINES}, got {self.baseline!r}"
            )
        check_gamma(self.gamma, "AWRCredit")
        check_eps(self.eps, "AWRCredit")
        if not (math.isfinite(self.state_prior) and self.state_prior > 0):
            raise ValueError(
                f"AWRCredit: state_prior must be finite and > 0, got {self.state_prior}"
            )
        if self.value_folds < 2:
            raise ValueError(
                f"AWRCredit: value_folds must be >= 2 (cross-fitting), got {self.value_folds}"
            )
        if not (math.isfinite(self.min_weight) and 0 <= self.min_weight <= self.max_weight):
            raise ValueError(
                f"AWRCredit: min_weight must be in [0, max_weight={self.max_weight}], "
                f"got {self.min_weight}"
            )
        warn_unread_baseline_options(self.baseline, self._given_options())

    def _given_options(self) -> dict[str, object]:
        """The `BASELINE_OPTIONS` set to a value other than their default (one left at its
        default, or passed equal to it, changes nothing whatever the baseline)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name in BASELINE_OPTIONS and not _is_default(getattr(self, f.name), f.default)
        }

    def advantages(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        """A per turn, before the exponential."""
        out: dict[TurnKey, float] = {}
        seen: set[TurnKey] = set()
        if self.baseline == "group":
            for members in group_rollouts(rollouts).values():
                returns = [math.fsum(t.reward for t in turns) for _, turns in members]
                advs = group_normalize(returns, normalize_std=self.normalize_std, eps=self.eps)
                for (rollout, turns), adv in zip(members, advs, strict=True):
                    for turn in turns:
                        out[turn_key(rollout, turn, seen)] = adv
            return out
        per_turn: list[TurnReturn] = []
        features: list[Sequence[object]] = []
        action_feats: list[Sequence[object]] = []
        for rollout in active_rollouts(rollouts):
            turns = rollout.turns()
            returns = discounted_returns([t.reward for t in turns], self.gamma)
            per_turn += [
                (turn_key(rollout, t, seen), g, self.anchor_key(t), _action(t))
                for t, g in zip(turns, returns, strict=True)
            ]
            if self.baseline in ("value", "q_value"):
                features += [self.featurize(t) for t in turns]
            if self.baseline == "q_value":
                action_feats += [self.featurize_action(t) for t in turns]
        if self.baseline in ("value", "q_value"):
            return self._value_advantages(per_turn, features, action_feats or None)
        mean = math.fsum(g for _, g, _, _ in per_turn) / len(per_turn) if per_turn else 0.0
        if self.baseline == "mean":
            return {key: g - mean for key, g, _, _ in per_turn}
        if self.baseline == "state_action":
            return state_action_advantages(per_turn, mean=mean, prior=self.state_prior)
        return state_advantages(per_turn, mean=mean, prior=self.state_prior)

    def _value_advantages(
        self,
        per_turn: Sequence[TurnReturn],
        features: Sequence[Sequence[object]],
        action_feats: Sequence[Sequence[object]] | None = None,
    ) -> dict[TurnKey, float]:
        """G_k - V_{-f(k)}(s_k) (baseline="value"), or Q_{-f(k)}(s_k, a_k) - V_{-f(k)}(s_k)
        when `action_feats` are given (baseline="q_value")."""
        if not per_turn:
            return {}
        ids = [key[0] for key, _, _, _ in per_turn]
        returns = [g for _, g, _, _ in per_turn]

        def fitted(rows: Sequence[Sequence[object]]) -> list[float]:
            return cross_fitted_values(
                ids,
                rows,  # type: ignore[arg-type]
                returns,
                folds=self.value_folds,
                fit=self.fit_value,
                seed=self.value_seed,
            )

        values = fitted(features)
        targets = returns if action_feats is None else fitted(action_feats)
        return {key: q - v for (key, _, _, _), q, v in zip(per_turn, targets, values, strict=True)}

    def assign(self, rollouts: Sequence[Rollout]) -> dict[TurnKey, float]:
        advantages = self.advantages(rollouts)
        weights = awr_weights(list(advantages.values()), beta=self.beta, max_weight=self.max_weight)
        out = dict(zip(advantages.keys(), weights, strict=True))
        if not (self.state_normalize or self.normalize_mean or self.min_weight > 0):
            return out
        states: dict[TurnKey, AnchorKey | None] = {}
        kept: set[TurnKey] = set()
        for rollout in rollouts:
            for turn in rollout.turns():
                key = (rollout.id, turn.turn_id)
                states[key] = self.anchor_key(turn)
                if self.trained is None or self.trained(rollout, turn):
                    kept.add(key)
        counted = {k for k in out if k in kept}
        if self.state_normalize:
            out = normalize_per_state(out, {key: states.get(key) for key in out}, counted=counted)
        if self.normalize_mean:
            out = normalize_mean(out, counted=counted)
        if not (self.normalize_mean or self.min_weight > 0):
            return out  # state_normalize alone: no second clip
        return {k: min(max(w, self.min_weight), self.max_weight) for k, w in out.items()}


def normalize_mean(weights: dict[TurnKey, float], *, counted: set[TurnKey]) -> dict[TurnKey, float]:
    """w_k / mean(w_j : j in `counted`): the counted turns average 1 (see
    `AWRCredit.normalize_mean`); unchanged when nothing is counted or the mean is 0."""
    ws = [w for k, w in weights.items() if k in counted]
    mean = math.fsum(ws) / len(ws) if ws else 0.0
    if not mean:
        return dict(weights)
    return {k: w / mean for k, w in weights.items()}


def normalize_per_state(
    weights: dict[TurnKey, float],
    states: dict[TurnKey, AnchorKey | None],
    *,
    counted: set[TurnKey] | None = None,
) -> dict[TurnKey, float]:
    """w_k / mean(w_j : s_j = s_k, j in `counted`): each state's counted turns (default: all)
    keep their mean weight of 1 (see `AWRCredit.state_normalize`); a turn without a state, or
    whose state has no counted turn (or only weights of 0), keeps its weight."""
    totals: dict[AnchorKey, list[float]] = defaultdict(list)
    for key, w in weights.items():
        state = states[key]
        if state is not None and (counted is None or key in counted):
            totals[state].append(w)
    means = {state: math.fsum(ws) / len(ws) for state, ws in totals.items()}
    out: dict[TurnKey, float] = {}
    for key, w in weights.items():
        state = states[key]
        mean = means.get(state) if state is not None else None
        out[key] = w / mean if mean else w  # an all-zero state (exp underflow) keeps 0
    return out


def _is_default(value: object, default: object) -> bool:
    return value is default or bool(value == default)


def _action(turn: Turn) -> str | None:
    """The action a turn sent to the env (None when it reached no env step)."""
    return turn.env_step.action if turn.env_step is not None else None
