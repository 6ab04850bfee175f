"""A learned state value for AWR's baseline (the paper's V), fitted on stored returns-to-go and
cross-fitted so that no turn's baseline has seen that turn's own return.

    V_{-f}(s) fitted on the turns of the rollouts outside fold f; a turn of fold f gets
    A = G - V_{-f}(s).

The value model sees a turn only through its features (`Featurizer`: hashable ids). The
default, `observation_features`, is general text features: the turn's state (its anchor key,
so a state seen in other folds is memorised, tabular) plus one (position, character) id per
character of the observation text (so a state seen nowhere else still gets a value from the
boards that look like it). The default model, `MLPValueFitter`, is a one-hidden-layer MLP over
those ids (an `EmbeddingBag` sum, ReLU, linear), trained full-batch with Adam on the squared
error. Any `ValueFitter` can replace it: a function from (features, targets) to a predictor.

Not here: bootstrapped (TD) targets, a value network sharing the policy's weights, or GPU
training; the fit is on CPU, deterministic for a given `seed`.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from ludic.training.credit.core import default_anchor_key
from ludic.types import Turn

logger = logging.getLogger(__name__)

QUIET_S = 5.0
"""A cross-fit that has run longer than this says how far it is after each fold."""

Features = Sequence[Hashable]
Featurizer = Callable[[Turn], Features]
Predictor = Callable[[Sequence[Features]], list[float]]
# (features of each training turn, its return-to-go) -> a predictor of the return-to-go.
ValueFitter = Callable[[Sequence[Features], Sequence[float]], Predictor]


def observation_features(turn: Turn, *, max_chars: int = 512) -> list[Hashable]:
    """The state id (`default_anchor_key`) and ("char", i, c) for the first `max_chars`
    characters c of the observation text (i: position). A turn without agent steps has none."""
    state = default_anchor_key(turn)
    if state is None:
        return []
    text = turn.observation[:max_chars]
    return [("state", state), *(("char", i, c) for i, c in enumerate(text))]


def action_features(turn: Turn, *, max_chars: int = 512) -> list[Hashable]:
    """`observation_features` plus ("action", a), a the action the turn sent to the env (none
    when it reached no env step): the default features of Q(s, a) (AWR's "q_value")."""
    feats = observation_features(turn, max_chars=max_chars)
    if not feats or turn.env_step is None:
        return feats
    return [*feats, ("action", turn.env_step.action)]


def fold_of(rollout_ids: Sequence[str], folds: int, seed: int) -> dict[str, int]:
    """Each distinct rollout id's fold in 0..folds-1: ids in order of first appearance,
    shuffled with `seed`, dealt round-robin (folds differ in size by at most one). The order,
    not the ids' values, decides, so data read in the same order gets the same folds even when
    its rollout ids are random."""
    ids = list(dict.fromkeys(rollout_ids))
    if folds < 2:
        raise ValueError(f"value baseline: value_folds must be >= 2 (cross-fitting), got {folds}")
    if len(ids) < folds:
        raise ValueError(
            f"value baseline: {len(ids)} rollouts cannot be split into {folds} folds; give "
            "more rollouts in one assign call or fewer value_folds"
        )
    random.Random(seed).shuffle(ids)
    return {rid: i % folds for i, rid in enumerate(ids)}


def cross_fitted_values(
    rollout_ids: Sequence[str],
    features: Sequence[Features],
    targets: Sequence[float],
    *,
    folds: int,
    fit: ValueFitter,
    seed: int = 0,
) -> list[float]:
    """V for every turn i, fitted on the turns of the rollouts in the other folds (turns of one
    rollout always share a fold, so a turn's baseline never saw its own return or its
    episode's)."""
    if not (len(rollout_ids) == len(features) == len(targets)):
        raise ValueError("cross_fitted_values: rollout_ids, features and targets differ in length")
    fold = fold_of(rollout_ids, folds, seed)
    out = [0.0] * len(targets)
    started = time.monotonic()
    for f in range(folds):
        train = [i for i, rid in enumerate(rollout_ids) if fold[rid] != f]
        held = [i for i, rid in enumerate(rollout_ids) if fold[rid] == f]
        if not held:
            continue
        predict = fit([features[i] for i in train], [targets[i] for i in train])
        for i, v in zip(held, predict([features[i] for i in held]), strict=True):
            out[i] = v
        elapsed = time.monotonic() - started
        if elapsed > QUIET_S:  # a long fit (large data, many epochs): say it is no hang
            logger.warning(
                "value baseline: fold %d of %d fitted (%d turns) after %.0f s (one fit per "
                "fold: fewer folds, --awr-value-folds, or fewer turns make it shorter)",
                f + 1,
                folds,
                len(train),
                elapsed,
            )
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class MLPValueFitter:
    """A tiny MLP value model over feature ids: v(x) = w2 . relu(sum_{f in x} E_f + b1) + b2,
    E the embedding of each feature id seen in training (unseen ids are ignored), trained
    full-batch with Adam (`epochs` steps, `lr`, `weight_decay`) on the mean squared error,
    starting at b2 = mean(target)."""

    hidden: int = 32
    epochs: int = 100
    lr: float = 0.02
    weight_decay: float = 1e-2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden < 1 or self.epochs < 0:
            raise ValueError(
                f"MLPValueFitter: hidden must be >= 1 and epochs >= 0, got {self.hidden}, "
                f"{self.epochs}"
            )
        if not self.lr > 0:
            raise ValueError(f"MLPValueFitter: lr must be > 0, got {self.lr}")

    def __call__(self, features: Sequence[Features], targets: Sequence[float]) -> Predictor:
        if not features:
            raise ValueError("MLPValueFitter: no training turns to fit a value on")
        vocab: dict[Hashable, int] = {}
        for row in features:
            for feat in row:
                vocab.setdefault(feat, len(vocab))
        generator = torch.Generator().manual_seed(self.seed)
        mean = math.fsum(targets) / len(targets)
        model = ValueMLP(max(len(vocab), 1), self.hidden, mean=mean, generator=generator)
        ids_N, offsets_B = _bags(features, vocab)
        target_B = torch.tensor(list(targets), dtype=torch.float32)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        for _ in range(self.epochs):
            optimizer.zero_grad()
            loss = torch.mean((model(ids_N, offsets_B) - target_B) ** 2)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()

        def predict(rows: Sequence[Features]) -> list[float]:
            if not rows:
                return []
            ids, offsets = _bags(rows, vocab)
            with torch.no_grad():
                return [float(v) for v in model(ids, offsets)]

        return predict


DEFAULT_VALUE_FITTER = MLPValueFitter()


class ValueMLP(torch.nn.Module):
    """v = out(relu(sum of the row's feature embeddings + bias)); `MLPValueFitter`'s model."""

    def __init__(self, vocab: int, hidden: int, *, mean: float, generator: torch.Generator) -> None:
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(vocab, hidden, mode="sum")
        self.bias = torch.nn.Parameter(torch.zeros(hidden))
        self.out = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            self.embed.weight.normal_(0.0, 0.1, generator=generator)
            self.out.weight.normal_(0.0, 0.1, generator=generator)
            self.out.bias.fill_(mean)

    def forward(self, ids_N: torch.Tensor, offsets_B: torch.Tensor) -> torch.Tensor:
        hidden_BH = torch.relu(self.embed(ids_N, offsets_B) + self.bias)
        return self.out(hidden_BH).squeeze(-1)


def _bags(
    rows: Sequence[Features], vocab: dict[Hashable, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_N, offsets_B) for `torch.nn.EmbeddingBag`: each row's known feature ids (N: all
    ids of the batch, B: rows)."""
    ids: list[int] = []
    offsets: list[int] = []
    for row in rows:
        offsets.append(len(ids))
        ids.extend(vocab[f] for f in row if f in vocab)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long)
