"""Merging step info dicts without silently overwriting the keys Ludic itself relies on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Keys written by Ludic's agents and protocols, which training, filters and eval read.
RESERVED_INFO_KEYS: frozenset[str] = frozenset(
    {
        "parse_error",
        "incomplete_completion",
        "tool_loop_exhausted",
        "synthetic",
        "observed",
        "action_not_executed",
        "parser_exception",
        "tool_errors",
        "truncation_reason",
        "finish_reason",
        "policy_version",
        "state_key",
        "observation",
        "child_rollout_ids",
        "error",
    }
)


def merge_step_info(
    base: Mapping[str, Any],
    *extras: Mapping[str, Any],
    reserved: frozenset[str] = RESERVED_INFO_KEYS,
) -> dict[str, Any]:
    """Merge dicts left to right. A reserved key already present with a different value
    raises ValueError naming the key, so an env cannot clobber e.g. `parse_error`; other keys:
    later values win."""
    merged = dict(base)
    for extra in extras:
        for key, value in extra.items():
            if key in reserved and key in merged and merged[key] != value:
                raise ValueError(
                    f"step info key {key!r} is reserved by Ludic and already set to "
                    f"{merged[key]!r}; refusing to overwrite it with {value!r}. Rename the key "
                    "in your env's or tool's info."
                )
            merged[key] = value
    return merged
