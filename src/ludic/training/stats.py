"""Declarative metrics over samples or rollouts: a `Reducer` names a dotted source path and a
reduction; `aggregate_stats` applies a dict of them to a list of records.

A path walks mappings by key and objects by attribute, so `"meta.reward"` reads a SAWItem's
`meta["reward"]` and `"total_reward"` reads a Rollout's property. Records where the path is
missing (or None) are skipped. No logging or tensor maths here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

Reduction = Literal["mean", "sum", "count", "max", "min"]
REDUCTIONS: tuple[str, ...] = get_args(Reduction)
_MISSING = object()


def lookup(record: Any, path: str) -> Any:
    """The value at dotted `path` in `record`, or None when some part is missing."""
    value = record
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        else:
            value = getattr(value, part, _MISSING)
        if value is _MISSING or value is None:
            return None
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Reducer:
    """`reduce` over the values at `source` (dotted path) of records that have it.

    mean / sum / max / min use `float(transform(value))` (`transform` defaults to identity, so
    booleans become 0/1 and a mean of them is a rate); count is the number of records that have
    the value. An empty selection gives 0.0 for count and sum and is left out for the others.
    """

    source: str
    reduce: Reduction = "mean"
    transform: Callable[[Any], float] | None = None

    def __post_init__(self) -> None:
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"Reducer.reduce must be one of {REDUCTIONS}, got {self.reduce!r}")
        if not self.source:
            raise ValueError("Reducer.source must be a non-empty dotted path, e.g. 'meta.reward'")

    def __call__(self, records: Sequence[Any]) -> float | None:
        raw = [v for v in (lookup(r, self.source) for r in records) if v is not None]
        if self.reduce == "count":
            return float(len(raw))
        values = [float(self.transform(v) if self.transform else v) for v in raw]
        if self.reduce == "sum":
            return float(sum(values))
        if not values:
            return None
        if self.reduce == "mean":
            return sum(values) / len(values)
        return max(values) if self.reduce == "max" else min(values)


def aggregate_stats(
    reducers: Mapping[str, Reducer], records: Sequence[Any], *, prefix: str = ""
) -> dict[str, float]:
    """`{prefix + name: reducer(records)}` for every reducer with a value."""
    out: dict[str, float] = {}
    for name, reducer in reducers.items():
        value = reducer(records)
        if value is not None:
            out[prefix + name] = value
    return out


def default_sample_reducers() -> dict[str, Reducer]:
    """Reducers the Trainer logs for every batch of samples."""
    return {
        "reward_mean": Reducer(source="meta.reward"),
        "weight_mean": Reducer(source="weight"),
        "truncated_rate": Reducer(source="meta.truncated"),
        "seq_len_truncated": Reducer(source="meta.seq_len_truncated", reduce="sum"),
        "parse_error_rate": Reducer(source="meta.parse_error"),
        "num_tokens_mean": Reducer(source="num_tokens"),
        "num_action_tokens_mean": Reducer(source="num_action_tokens"),
    }
