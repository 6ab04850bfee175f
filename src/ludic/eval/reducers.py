"""Reducers: episode records in, metrics out (means, outcome rates, pass@k, mean@k).

A reducer is any callable `Sequence[EpisodeRecord] -> float | Mapping[str, float] | None`;
`reduce_metrics` names the results. Every episode counts, failed ones included (they have reward
0 and are never successful; `failed_rate` shows how many there were). No I/O here.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ludic.eval.records import EpisodeRecord

_MISSING = object()
ReducerValue = float | Mapping[str, float] | None


@runtime_checkable
class Reducer(Protocol):
    """Turns the episodes of one evaluation into a metric (or several, or none)."""

    def __call__(self, episodes: Sequence[EpisodeRecord]) -> ReducerValue: ...


def lookup(record: object, path: str) -> Any:
    """The value at dotted `path` (attributes, then mapping keys), or None when missing."""
    value: Any = record
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        else:
            value = getattr(value, part, _MISSING)
        if value is _MISSING or value is None:
            return None
    return value


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1..n} (1 - k/i), which avoids huge binomials (Chen et al.,
    2021, "Evaluating Large Language Models Trained on Code").
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(
            f"pass@{k} needs at least k={k} samples per problem, got n={n}; sample more per "
            "problem (samples_per_problem >= k) or lower k"
        )
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def group_episodes(
    episodes: Sequence[EpisodeRecord],
) -> dict[tuple[str, str], list[EpisodeRecord]]:
    """Episodes by `group_key` (problem, agent), in first-seen order."""
    groups: dict[tuple[str, str], list[EpisodeRecord]] = defaultdict(list)
    for ep in episodes:
        groups[ep.group_key].append(ep)
    return dict(groups)


@dataclass(frozen=True, kw_only=True, slots=True)
class Mean:
    """Mean of `float(value)` at dotted `path` over the episodes that have it (booleans give
    rates). `skip_failed` leaves failed episodes out. None when no episode has the value."""

    path: str
    skip_failed: bool = False

    def __call__(self, episodes: Sequence[EpisodeRecord]) -> float | None:
        values = [
            float(v)
            for ep in episodes
            if not (self.skip_failed and ep.failed)
            for v in (lookup(ep, self.path),)
            if v is not None
        ]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """Fraction of episodes per distinct value at `path` (default: the outcome label), e.g.
    `{"win": 0.5, "loss": 0.25, "draw": 0.25}`. Episodes without the value count as "none"."""

    path: str = "outcome"

    def __call__(self, episodes: Sequence[EpisodeRecord]) -> dict[str, float]:
        if not episodes:
            return {}
        counts = Counter(str(lookup(ep, self.path)).lower() for ep in episodes)
        return {label: n / len(episodes) for label, n in sorted(counts.items())}


@dataclass(frozen=True, kw_only=True, slots=True)
class PassAtK:
    """Mean over problems of the unbiased pass@k (see `pass_at_k`).

    Episodes are grouped by problem (`group_key`); a group's n samples must be >= k, and an
    episode counts as correct when the value at `success_path` is truthy.
    """

    k: int
    success_path: str = "success"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"PassAtK.k must be >= 1, got {self.k}")

    def __call__(self, episodes: Sequence[EpisodeRecord]) -> float | None:
        groups = group_episodes(episodes)
        if not groups:
            return None
        scores = []
        for key, members in groups.items():
            if len(members) < self.k:
                raise ValueError(
                    f"pass@{self.k}: problem {key[0]!r} has {len(members)} samples, fewer than "
                    f"k={self.k}; evaluate with samples_per_problem >= {self.k}"
                )
            correct = sum(1 for ep in members if lookup(ep, self.success_path))
            scores.append(pass_at_k(len(members), correct, self.k))
        return sum(scores) / len(scores)


@dataclass(frozen=True, kw_only=True, slots=True)
class MeanAtK:
    """Mean over problems of the per-problem mean of the value at `path` (default: reward).

    With n >= k samples per problem, the mean of all n is an unbiased estimate of the expected
    mean of k samples; k only sets the minimum n (mean@k of `success` equals pass@1).
    """

    k: int
    path: str = "total_reward"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"MeanAtK.k must be >= 1, got {self.k}")

    def __call__(self, episodes: Sequence[EpisodeRecord]) -> float | None:
        groups = group_episodes(episodes)
        if not groups:
            return None
        means = []
        for key, members in groups.items():
            if len(members) < self.k:
                raise ValueError(
                    f"mean@{self.k}: problem {key[0]!r} has {len(members)} samples, fewer than "
                    f"k={self.k}; evaluate with samples_per_problem >= {self.k}"
                )
            values = [float(lookup(ep, self.path) or 0.0) for ep in members]
            means.append(sum(values) / len(values))
        return sum(means) / len(means)


@dataclass(frozen=True, kw_only=True, slots=True)
class Count:
    """How many episodes satisfy `where` (all episodes by default)."""

    where: Callable[[EpisodeRecord], bool] | None = None

    def __call__(self, episodes: Sequence[EpisodeRecord]) -> float:
        return float(sum(1 for ep in episodes if self.where is None or self.where(ep)))


def default_reducers(k_values: Sequence[int] = ()) -> dict[str, Reducer]:
    """The metrics `ludic eval` reports, plus pass@k and mean@k for each k in `k_values`."""
    reducers: dict[str, Reducer] = {
        "episodes": Count(),
        "reward/mean": Mean(path="total_reward"),
        "success_rate": Mean(path="success"),
        "outcome": Rates(path="outcome"),
        "failed_rate": Mean(path="failed"),
        "truncated_rate": Mean(path="truncated"),
        "parse_errors/mean": Mean(path="num_parse_errors", skip_failed=True),
        "turns/mean": Mean(path="num_turns", skip_failed=True),
        "completion_tokens/mean": Mean(path="completion_tokens", skip_failed=True),
    }
    for k in k_values:
        reducers[f"pass@{k}"] = PassAtK(k=k)
        reducers[f"mean@{k}"] = MeanAtK(k=k)
    return reducers


def reduce_metrics(
    reducers: Mapping[str, Reducer], episodes: Sequence[EpisodeRecord]
) -> dict[str, float]:
    """`{name: value}` for scalar reducers, `{name/label: value}` for mapping ones; None
    results are left out."""
    metrics: dict[str, float] = {}
    for name, reducer in reducers.items():
        value = reducer(episodes)
        if value is None:
            continue
        if isinstance(value, Mapping):
            metrics.update({f"{name}/{label}": float(v) for label, v in value.items()})
        else:
            metrics[name] = float(value)
    return metrics
