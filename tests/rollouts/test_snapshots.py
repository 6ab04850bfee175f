"""Context rewrites become snapshot samples, with an explicit reward/weight rule (seed 002)."""

from __future__ import annotations

import pytest
from rollout_fakes import call, env_step, uniform_weights

from ludic.rollouts import build_samples
from ludic.types import Rollout


def one_turn(*calls_: tuple[list[int], list[int]], info: dict[int, dict] | None = None) -> Rollout:
    info = info or {}
    steps = [
        call(p, c, target="env" if i == len(calls_) - 1 else "internal", info=info.get(i, {}))
        for i, (p, c) in enumerate(calls_)
    ]
    return Rollout(steps=[*steps, env_step("t0", reward=1.0)], meta={"group_id": "g7"})


def seq(samples):
    return [(s.input_ids, s.action_mask) for s in samples]


def test_zero_rewrites_is_one_final_sample() -> None:
    r = one_turn(([1, 2], [3]), ([1, 2, 3, 4], [5]))
    (s,) = build_samples([r], uniform_weights([r], 2.0))
    assert s.meta["num_segments"] == 1 and s.meta["is_snapshot"] is False
    assert s.meta["sample_id"] == f"{r.id}:t0:0" and s.meta["parent_sample_id"] is None


def test_one_rewrite_in_the_middle_closes_a_snapshot_and_starts_from_the_new_prompt() -> None:
    # Calls 3 and 4 see a rewritten context [1, 9] (the earlier turns were deleted).
    r = one_turn(([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1, 9], [6]), ([1, 9, 6, 8], [7]))
    snap, final = build_samples([r], uniform_weights([r], 2.0))
    assert seq([snap, final]) == [
        ((1, 2, 3, 4, 5), (0, 0, 1, 0, 1)),
        ((1, 9, 6, 8, 7), (0, 0, 1, 0, 1)),
    ]
    assert snap.behavior_logprobs == (0.0, 0.0, -3.0, 0.0, -5.0)
    assert (snap.meta["segment_index"], snap.meta["is_snapshot"]) == (0, True)
    assert (final.meta["segment_index"], final.meta["is_snapshot"]) == (1, False)
    assert final.meta["parent_sample_id"] == snap.meta["sample_id"]
    for s in (snap, final):
        assert s.meta["num_segments"] == 2
        assert s.meta["rollout_id"] == r.id and s.meta["group_id"] == "g7"
        assert s.meta["turn_id"] == "t0"
        # "share" (default): every segment carries the turn's weight and reward.
        assert s.weight == 2.0 and s.meta["reward"] == 1.0
        assert s.meta["weight_source"] == "credit"


def test_rewrite_right_after_the_first_call() -> None:
    r = one_turn(([1, 2], [3]), ([7], [8]), ([7, 8, 9], [10]))
    assert seq(build_samples([r], uniform_weights([r]))) == [
        ((1, 2, 3), (0, 0, 1)),
        ((7, 8, 9, 10), (0, 1, 0, 1)),
    ]


def test_rewrite_at_the_last_call() -> None:
    r = one_turn(([1], [2]), ([1, 2, 3], [4]), ([5, 6], [7]))
    samples = build_samples([r], uniform_weights([r]))
    assert seq(samples) == [((1, 2, 3, 4), (0, 1, 0, 1)), ((5, 6, 7), (0, 0, 1))]
    assert [s.meta["is_snapshot"] for s in samples] == [True, False]


def test_many_rewrites_chain_parents_in_order() -> None:
    r = one_turn(([1], [2]), ([3], [4]), ([5], [6]), ([7], [8]))
    samples = build_samples([r], uniform_weights([r]))
    assert [s.input_ids for s in samples] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert [s.meta["is_snapshot"] for s in samples] == [True, True, True, False]
    assert [s.meta["segment_index"] for s in samples] == [0, 1, 2, 3]
    ids = [s.meta["sample_id"] for s in samples]
    assert [s.meta["parent_sample_id"] for s in samples] == [None, *ids[:-1]]
    assert len(set(ids)) == 4


def test_empty_segment_is_dropped_and_indices_stay_contiguous() -> None:
    # The middle call sampled nothing before the context was rewritten again.
    r = one_turn(([1], [2]), ([5], []), ([6], [7]))
    samples = build_samples([r], uniform_weights([r]))
    assert seq(samples) == [((1, 2), (0, 1)), ((6, 7), (0, 1))]
    assert [s.meta["segment_index"] for s in samples] == [0, 1]
    assert samples[1].meta["parent_sample_id"] == samples[0].meta["sample_id"]
    assert all(s.meta["num_segments"] == 2 for s in samples)


def test_a_turn_with_no_action_tokens_gives_no_sample() -> None:
    r = one_turn(([1], []), ([5], []))
    assert build_samples([r], uniform_weights([r])) == []


def test_split_policy_divides_the_turn_weight_over_its_segments() -> None:
    many = one_turn(([1], [2]), ([3], [4]), ([5], [6]), ([7], [8]))
    few = one_turn(([1], [2]), ([1, 2, 3], [4]))
    w = {**uniform_weights([many], 1.2), **uniform_weights([few], 1.2)}
    samples = build_samples([many, few], w, snapshot_policy="split")
    by_rollout = {r.id: [s for s in samples if s.meta["rollout_id"] == r.id] for r in (many, few)}
    # 1.2 / 4 = 0.3 per segment; the unsplit turn keeps 1.2: both rollouts total 1.2.
    assert [s.weight for s in by_rollout[many.id]] == pytest.approx([0.3] * 4, abs=1e-12)
    assert [s.weight for s in by_rollout[few.id]] == [1.2]
    assert sum(s.weight for s in by_rollout[many.id]) == pytest.approx(1.2, abs=1e-12)
    assert by_rollout[many.id][0].meta["weight_source"] == "credit/4"
    assert all(s.meta["credit_weight"] == 1.2 and s.meta["reward"] == 1.0 for s in samples)


def test_own_reward_policy_uses_snapshot_rewards_and_the_final_segment_carries_the_outcome() -> (
    None
):
    # Calls 0 and 1 close snapshots; each recorded a precomputed (context-length) penalty.
    r = one_turn(
        ([1], [2]),
        ([3], [4]),
        ([5], [6]),
        info={0: {"snapshot_reward": -0.1}, 1: {"snapshot_reward": -0.25}},
    )
    samples = build_samples([r], uniform_weights([r], 0.8), snapshot_policy="own_reward")
    assert [s.weight for s in samples] == [-0.1, -0.25, 0.8]
    assert [s.meta["reward"] for s in samples] == [-0.1, -0.25, 1.0]
    assert [s.meta["weight_source"] for s in samples] == [
        "snapshot_reward",
        "snapshot_reward",
        "credit",
    ]


def test_own_reward_without_a_recorded_snapshot_reward_is_a_clear_error() -> None:
    r = one_turn(([1], [2]), ([3], [4]))
    with pytest.raises(ValueError, match="no info\\['snapshot_reward'\\]"):
        build_samples([r], uniform_weights([r]), snapshot_policy="own_reward")


def test_unknown_policy_and_mode_are_refused() -> None:
    with pytest.raises(ValueError, match="snapshot_policy"):
        build_samples([], {}, snapshot_policy="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample mode"):
        build_samples([], {}, mode="step")  # type: ignore[arg-type]


def test_episode_mode_rewrite_at_a_turn_boundary() -> None:
    # Turn t1's prompt drops turn t0 (deleted context); turn t2 extends t1.
    steps = [
        call([1], [2], turn_id="t0"),
        env_step("t0", reward=0.0),
        call([9], [3], turn_id="t1"),
        env_step("t1", reward=0.0),
        call([9, 3, 4], [5], turn_id="t2"),
        env_step("t2", reward=1.0, terminated=True),
    ]
    r = Rollout(steps=steps, meta={"group_id": "g"})
    snap, final = build_samples([r], uniform_weights([r], 0.5), mode="episode")
    assert seq([snap, final]) == [((1, 2), (0, 1)), ((9, 3, 4, 5), (0, 1, 0, 1))]
    assert snap.meta["turn_ids"] == ["t0"] and final.meta["turn_ids"] == ["t1", "t2"]
    assert snap.meta["is_snapshot"] and not final.meta["is_snapshot"]
    assert snap.weight == final.weight == 0.5
    assert snap.meta["reward"] == final.meta["reward"] == 1.0
    assert snap.meta["sample_id"] == f"{r.id}:episode:0"
