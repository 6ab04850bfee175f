"""Sample filters read the sample builder's meta; combine keeps only when all keep."""

from __future__ import annotations

import pytest
from training_fakes import item

from ludic.training import (
    combine,
    drop_incomplete_completions,
    drop_parse_errors,
    drop_stale,
    drop_truncated,
)
from ludic.training.filters import apply_filters


def test_drop_truncated() -> None:
    keep = drop_truncated()
    assert keep(item(4, truncated=False))
    assert not keep(item(4, truncated=True, truncation_reason="env"))
    # An earlier turn of a truncated episode carries episode_truncated only.
    assert not keep(item(4, truncated=False, episode_truncated=True))
    capped = item(4, truncated=True, truncation_reason="max_seq_len")
    assert not keep(capped)
    assert drop_truncated(include_seq_len=False)(capped)


def test_drop_incomplete_completions() -> None:
    keep = drop_incomplete_completions()
    assert keep(item(4, finish_reason="stop"))
    assert not keep(item(4, finish_reason="length"))
    assert not keep(item(4, incomplete_completion=True, finish_reason="stop"))


def test_drop_parse_errors() -> None:
    keep = drop_parse_errors()
    assert keep(item(4, parse_error=False)) and keep(item(4))
    assert not keep(item(4, parse_error=True))


def test_drop_stale_uses_oldest_token_version() -> None:
    keep = drop_stale(current_version=5, max_lag=2)
    assert keep(item(4, versions=[3, 5])) and keep(item(4))
    assert not keep(item(4, versions=[2, 5]))
    with pytest.raises(ValueError, match="max_lag"):
        drop_stale(0, -1)


def test_combine_and_apply() -> None:
    items = [
        item(4, seed=0),
        item(4, seed=1, parse_error=True),
        item(4, seed=2, finish_reason="length"),
        item(4, seed=3, truncated=True, truncation_reason="env"),
    ]
    keep = combine(drop_parse_errors(), drop_incomplete_completions())
    assert [keep(i) for i in items] == [True, False, False, True]
    assert all(combine()(i) for i in items)
    kept, dropped = apply_filters(items, [keep, drop_truncated()])
    assert kept == [items[0]] and dropped == 3
