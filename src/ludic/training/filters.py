"""Sample filters: small predicates over `SAWItem` meta (True = keep) and `combine`.

They only read meta written by the sample builder (`truncated`, `finish_reason`,
`incomplete_completion`, `parse_error`, `policy_versions`); they never look at tokens or
change items. Filtering changes which samples a batch holds, not the credit already assigned.
"""

from __future__ import annotations

from collections.abc import Sequence

from ludic.rollouts.samples import SampleFilter, SAWItem


def drop_truncated(*, include_seq_len: bool = True) -> SampleFilter:
    """Drop samples of truncated episodes: `meta["episode_truncated"]` (every turn of an episode
    cut by a time limit or the env, since all its Monte Carlo returns are cut short) or
    `meta["truncated"]` (the sample itself was cut).

    With `include_seq_len=False`, samples only cut by the trainer's `max_seq_len` are kept.
    """

    def keep(item: SAWItem) -> bool:
        meta = item.meta
        if meta.get("episode_truncated", False):
            return False
        if not meta.get("truncated", False):
            return True
        return not include_seq_len and meta.get("truncation_reason") == "max_seq_len"

    return keep


def drop_incomplete_completions() -> SampleFilter:
    """Drop samples whose completion hit the token limit (`finish_reason == "length"`, or the
    agent's `incomplete_completion` flag)."""

    def keep(item: SAWItem) -> bool:
        meta = item.meta
        return not (meta.get("incomplete_completion") or meta.get("finish_reason") == "length")

    return keep


def drop_parse_errors() -> SampleFilter:
    """Drop samples containing an action the parser rejected (`meta["parse_error"]`)."""

    def keep(item: SAWItem) -> bool:
        return not item.meta.get("parse_error", False)

    return keep


def drop_stale(current_version: int, max_lag: int) -> SampleFilter:
    """Drop samples whose oldest token came from a policy more than `max_lag` versions behind
    `current_version`. Samples without recorded policy versions are kept."""
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")

    def keep(item: SAWItem) -> bool:
        versions = item.policy_versions
        return not versions or current_version - min(versions) <= max_lag

    return keep


def combine(*filters: SampleFilter) -> SampleFilter:
    """A filter that keeps a sample only when every filter keeps it (no filters: keep all)."""

    def keep(item: SAWItem) -> bool:
        return all(f(item) for f in filters)

    return keep


def apply_filters(
    items: Sequence[SAWItem], filters: Sequence[SampleFilter]
) -> tuple[list[SAWItem], int]:
    """(kept items in order, number dropped)."""
    keep = combine(*filters)
    kept = [item for item in items if keep(item)]
    return kept, len(items) - len(kept)
