"""GRPORequestStrategy.expand refuses a request given more than once without a group_id: the
copies (each a problem with its own seeds) would share one group and its baseline, so the
advantages would rank problems instead of actions (`generate_batch(engine, [problem] * 4, ...)`).
RolloutBatchSource renames repeats itself; copies with distinct ids or group ids are fine."""

from __future__ import annotations

import dataclasses

import pytest

from ludic.rollouts import ComponentSpec, GRPORequestStrategy, RolloutRequest


def problem(request_id: str = "p", group_id: str | None = None) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="env"),
        protocol=ComponentSpec(name="agent"),
        request_id=request_id,
        group_id=group_id,
    )


def test_a_repeated_request_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"request 'p' appears more than once without a group_id"):
        GRPORequestStrategy(group_size=2).expand([problem()] * 3)


def test_distinct_ids_or_explicit_groups_expand() -> None:
    strategy = GRPORequestStrategy(group_size=2)
    assert len(strategy.expand([problem("a"), problem("b")])) == 4
    shared = problem("p", group_id="g")
    assert len(strategy.expand([shared, dataclasses.replace(shared)])) == 4
