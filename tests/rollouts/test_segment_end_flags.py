"""Each segment's terminated / truncated says what happened to that segment: a piece closed by
an edit (snapshot) or template drift was not cut; the piece that ends the episode carries its
end (seed 000 "Training sees truncation", seed 002 snapshots)."""

from __future__ import annotations

from typing import Any

from rollout_fakes import call, env_step, uniform_weights

from ludic.rollouts import build_samples
from ludic.training.filters import drop_truncated
from ludic.types import Rollout


def flags(s: Any) -> tuple[Any, ...]:
    m = s.meta
    return (m["terminated"], m["truncated"], m["episode_truncated"], m["truncation_reason"])


def edited_episode(**last: Any) -> Rollout:
    """Turn t1's prompt drops turn t0 (a context edit at the turn boundary); t2 extends t1."""
    steps = [
        call([1], [2], turn_id="t0", info={"context_version": 0}),
        env_step("t0"),
        call([9], [3], turn_id="t1", info={"context_version": 1}),
        env_step("t1"),
        call([9, 3, 4], [5], turn_id="t2", info={"context_version": 1}),
        env_step("t2", reward=1.0, **last),
    ]
    meta = {"episode_truncated": True, "truncation_reason": "env"} if last.get("truncated") else {}
    return Rollout(steps=steps, meta=meta)


def test_episode_mode_snapshot_of_a_truncated_episode_is_not_itself_truncated() -> None:
    r = edited_episode(truncated=True, truncation_reason="env")
    snap, final = build_samples([r], uniform_weights([r]), mode="episode")
    assert snap.meta["is_snapshot"] and not final.meta["is_snapshot"]
    assert flags(snap) == (False, False, True, "env")
    assert flags(final) == (False, True, True, "env")
    # drop_truncated still drops every sample of a truncated episode (episode_truncated).
    assert [drop_truncated()(s) for s in (snap, final)] == [False, False]


def test_episode_mode_snapshot_of_a_terminated_episode_is_not_terminated() -> None:
    r = edited_episode(terminated=True)
    snap, final = build_samples([r], uniform_weights([r]), mode="episode")
    assert flags(snap) == (False, False, False, None)
    assert flags(final) == (True, False, False, None)
    assert [drop_truncated()(s) for s in (snap, final)] == [True, True]


def test_episode_mode_drift_piece_at_a_turn_boundary_is_not_cut() -> None:
    # t1's prompt re-renders t0's completion [2] as [22]: drift, same context version.
    steps = [
        call([1], [2], turn_id="t0"),
        env_step("t0"),
        call([1, 22, 4], [5], turn_id="t1"),
        env_step("t1", reward=1.0, truncated=True, truncation_reason="env"),
    ]
    r = Rollout(steps=steps, meta={"episode_truncated": True, "truncation_reason": "env"})
    first, last = build_samples([r], uniform_weights([r]), mode="episode")
    assert first.meta["drift_split"] and not last.meta["drift_split"]
    assert flags(first) == (False, False, True, "env")
    assert flags(last) == (False, True, True, "env")


def test_turn_mode_snapshot_inside_the_last_turn_is_not_cut() -> None:
    # The last turn makes two calls; the second sees a rewritten context (an edit mid-turn).
    steps = [
        call([1], [2], turn_id="t0", target="internal", info={"context_version": 0}),
        call([7], [8], turn_id="t0", info={"context_version": 1}),
        env_step("t0", reward=1.0, terminated=True),
    ]
    r = Rollout(steps=steps)
    snap, final = build_samples([r], uniform_weights([r]))
    assert snap.meta["is_snapshot"]
    assert flags(snap) == (False, False, False, None)
    assert flags(final) == (True, False, False, None)


def test_episode_mode_empty_last_completion_moves_the_end_to_the_last_kept_piece() -> None:
    # t1 sees an edited context and completes nothing: its piece has no action tokens and is
    # dropped, so the episode's end goes to t0's snapshot, the last piece that is trained on.
    for last, expected in (
        ({"truncated": True, "truncation_reason": "env"}, (False, True, True, "env")),
        ({"terminated": True}, (True, False, False, None)),
    ):
        steps = [
            call([1], [2], turn_id="t0", info={"context_version": 0}),
            env_step("t0"),
            call([9], [], turn_id="t1", info={"context_version": 1}),
            env_step("t1", reward=1.0, **last),
        ]
        meta = (
            {"episode_truncated": True, "truncation_reason": "env"} if "truncated" in last else {}
        )
        r = Rollout(steps=steps, meta=meta)
        (only,) = build_samples([r], uniform_weights([r]), mode="episode")
        assert only.meta["is_snapshot"]
        assert flags(only) == expected


def test_turn_mode_empty_last_completion_moves_the_end_to_the_turns_kept_piece() -> None:
    # The turn's closing call (after an edit mid-turn) completes nothing and is dropped.
    steps = [
        call([1], [2], turn_id="t0", target="internal", info={"context_version": 0}),
        call([7], [], turn_id="t0", info={"context_version": 1}),
        env_step("t0", reward=1.0, truncated=True, truncation_reason="env"),
    ]
    r = Rollout(steps=steps, meta={"episode_truncated": True, "truncation_reason": "env"})
    (only,) = build_samples([r], uniform_weights([r]))
    assert only.meta["is_snapshot"]
    assert flags(only) == (False, True, True, "env")


def test_turn_mode_empty_last_turn_moves_the_end_to_the_previous_turns_sample() -> None:
    # The last turn completes nothing at all, so it gives no sample: the episode's end goes to
    # the previous turn's sample, else no sample of the ended or cut episode would say so.
    for last, expected in (
        ({"truncated": True, "truncation_reason": "env"}, (False, True, True, "env")),
        ({"terminated": True}, (True, False, False, None)),
    ):
        steps = [
            call([1], [2], turn_id="t0"),
            env_step("t0"),
            call([1, 2, 3], [], turn_id="t1"),
            env_step("t1", reward=1.0, **last),
        ]
        meta = (
            {"episode_truncated": True, "truncation_reason": "env"} if "truncated" in last else {}
        )
        r = Rollout(steps=steps, meta=meta)
        (only,) = build_samples([r], uniform_weights([r]))
        assert only.meta["turn_id"] == "t0"
        assert flags(only) == expected
