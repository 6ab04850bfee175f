"""Reducers over dotted paths into samples and rollouts."""

from __future__ import annotations

import pytest
from training_fakes import item

from ludic.training import Reducer, aggregate_stats
from ludic.training.stats import lookup
from ludic.types import Rollout


def test_lookup_walks_attributes_and_keys() -> None:
    sample = item(5, reward=2.0, nested={"a": {"b": 3}})
    assert lookup(sample, "meta.reward") == 2.0
    assert lookup(sample, "meta.nested.a.b") == 3
    assert lookup(sample, "num_tokens") == 5
    assert lookup(sample, "meta.missing.x") is None
    rollout = Rollout(meta={"episode_truncated": True})
    assert lookup(rollout, "meta.episode_truncated") is True
    assert lookup(rollout, "total_reward") == 0.0


def test_reductions_by_hand() -> None:
    samples = [item(4, reward=1.0, truncated=True), item(4, reward=3.0, truncated=False), item(4)]
    reducers = {
        "mean": Reducer(source="meta.reward"),
        "sum": Reducer(source="meta.reward", reduce="sum"),
        "count": Reducer(source="meta.reward", reduce="count"),
        "max": Reducer(source="meta.reward", reduce="max"),
        "min": Reducer(source="meta.reward", reduce="min"),
        "trunc_rate": Reducer(source="meta.truncated"),
        "doubled": Reducer(source="meta.reward", transform=lambda v: 2 * v),
        "absent": Reducer(source="meta.nothing"),
        "absent_sum": Reducer(source="meta.nothing", reduce="sum"),
    }
    # The third sample has no reward: skipped. truncated: (1 + 0) / 2.
    assert aggregate_stats(reducers, samples, prefix="s/") == {
        "s/mean": 2.0,
        "s/sum": 4.0,
        "s/count": 2.0,
        "s/max": 3.0,
        "s/min": 1.0,
        "s/trunc_rate": 0.5,
        "s/doubled": 4.0,
        "s/absent_sum": 0.0,
    }


def test_reducer_validation() -> None:
    with pytest.raises(ValueError, match="reduce"):
        Reducer(source="meta.x", reduce="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source"):
        Reducer(source="")
