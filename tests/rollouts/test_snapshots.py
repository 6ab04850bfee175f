"""Context rewrites become snapshot samples, with an explicit reward/weight rule (seed 002);
template drift is an exact split that is not a snapshot."""

from __future__ import annotations

import importlib
import logging

import pytest
from rollout_fakes import call, env_step, uniform_weights

from ludic.rollouts import build_samples
from ludic.types import Rollout

EDIT = "edit"  # marks a call whose prompt the context strategy rewrote


def one_turn(
    *calls_: tuple[list[int], list[int]] | tuple[list[int], list[int], str],
    info: dict[int, dict] | None = None,
) -> Rollout:
    """One turn of hand-made calls. A call given as (prompt, completion, EDIT) saw a rewritten
    history: its recorded context version is one more than the call before's."""
    info = info or {}
    steps, version = [], 0
    for i, (prompt, completion, *flag) in enumerate(calls_):
        version += bool(flag)
        target = "env" if i == len(calls_) - 1 else "internal"
        step_info = {"context_version": version, **info.get(i, {})}
        steps.append(call(prompt, completion, target=target, info=step_info))
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
    r = one_turn(([1, 2], [3]), ([1, 2, 3, 4], [5]), ([1, 9], [6], EDIT), ([1, 9, 6, 8], [7]))
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
    r = one_turn(([1, 2], [3]), ([7], [8], EDIT), ([7, 8, 9], [10]))
    assert seq(build_samples([r], uniform_weights([r]))) == [
        ((1, 2, 3), (0, 0, 1)),
        ((7, 8, 9, 10), (0, 1, 0, 1)),
    ]


def test_rewrite_at_the_last_call() -> None:
    r = one_turn(([1], [2]), ([1, 2, 3], [4]), ([5, 6], [7], EDIT))
    samples = build_samples([r], uniform_weights([r]))
    assert seq(samples) == [((1, 2, 3, 4), (0, 1, 0, 1)), ((5, 6, 7), (0, 0, 1))]
    assert [s.meta["is_snapshot"] for s in samples] == [True, False]


def test_many_rewrites_chain_parents_in_order() -> None:
    r = one_turn(([1], [2]), ([3], [4], EDIT), ([5], [6], EDIT), ([7], [8], EDIT))
    samples = build_samples([r], uniform_weights([r]))
    assert [s.input_ids for s in samples] == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert [s.meta["is_snapshot"] for s in samples] == [True, True, True, False]
    assert [s.meta["segment_index"] for s in samples] == [0, 1, 2, 3]
    ids = [s.meta["sample_id"] for s in samples]
    assert [s.meta["parent_sample_id"] for s in samples] == [None, *ids[:-1]]
    assert len(set(ids)) == 4


def test_empty_segment_is_dropped_and_indices_stay_contiguous() -> None:
    # The middle call sampled nothing before the context was rewritten again.
    r = one_turn(([1], [2]), ([5], [], EDIT), ([6], [7], EDIT))
    samples = build_samples([r], uniform_weights([r]))
    assert seq(samples) == [((1, 2), (0, 1)), ((6, 7), (0, 1))]
    assert [s.meta["segment_index"] for s in samples] == [0, 1]
    assert samples[1].meta["parent_sample_id"] == samples[0].meta["sample_id"]
    assert all(s.meta["num_segments"] == 2 for s in samples)


def test_a_turn_with_no_action_tokens_gives_no_sample() -> None:
    r = one_turn(([1], []), ([5], [], EDIT))
    assert build_samples([r], uniform_weights([r])) == []


def test_split_policy_divides_the_turn_weight_over_its_segments() -> None:
    many = one_turn(([1], [2]), ([3], [4], EDIT), ([5], [6], EDIT), ([7], [8], EDIT))
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
        ([3], [4], EDIT),
        ([5], [6], EDIT),
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


def test_own_reward_without_a_recorded_snapshot_reward_falls_back_to_the_credit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A strategy that records no snapshot reward (e.g. truncated thinking): the snapshot
    # takes the turn's credit, says so in meta, and the batch is not aborted.
    module = importlib.import_module("ludic.rollouts.build_samples")
    module._WARNED.discard("missing_snapshot_reward")
    r = one_turn(([1], [2]), ([3], [4], EDIT))
    with caplog.at_level(logging.WARNING, logger="ludic.rollouts.build_samples"):
        snap, final = build_samples([r], uniform_weights([r], 0.4), snapshot_policy="own_reward")
        build_samples([r], uniform_weights([r], 0.4), snapshot_policy="own_reward")
    assert snap.meta["is_snapshot"] and (snap.weight, snap.meta["reward"]) == (0.4, 1.0)
    assert snap.meta["weight_source"] == "credit (no snapshot_reward)"
    assert (final.weight, final.meta["weight_source"]) == (0.4, "credit")
    warnings = [m for m in caplog.messages if "no info['snapshot_reward']" in m]
    assert len(warnings) == 1  # once per process, not once per sample


def test_unknown_policy_and_mode_are_refused() -> None:
    with pytest.raises(ValueError, match="snapshot_policy"):
        build_samples([], {}, snapshot_policy="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sample mode"):
        build_samples([], {}, mode="step")  # type: ignore[arg-type]


def test_episode_mode_rewrite_at_a_turn_boundary() -> None:
    # Turn t1's prompt drops turn t0 (deleted context); turn t2 extends t1.
    steps = [
        call([1], [2], turn_id="t0", info={"context_version": 0}),
        env_step("t0", reward=0.0),
        call([9], [3], turn_id="t1", info={"context_version": 1}),
        env_step("t1", reward=0.0),
        call([9, 3, 4], [5], turn_id="t2", info={"context_version": 1}),
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


# ---- template drift: the history was append-only, its tokens were not -------------------


def test_drift_is_an_exact_split_that_is_not_a_snapshot() -> None:
    # Call 1's prompt re-renders call 0's completion [3] as [33] (same context version).
    r = one_turn(([1, 2], [3]), ([1, 2, 33, 4], [5]), ([1, 2, 33, 4, 5, 6], [7]))
    first, second = build_samples([r], uniform_weights([r], 2.0))
    assert seq([first, second]) == [
        ((1, 2, 3), (0, 0, 1)),
        ((1, 2, 33, 4, 5, 6, 7), (0, 0, 0, 0, 1, 0, 1)),
    ]
    assert [s.meta["is_snapshot"] for s in (first, second)] == [False, False]
    assert [s.meta["drift_split"] for s in (first, second)] == [True, False]
    # One segment in two pieces: the same segment, the same weight and reward.
    assert [(s.meta["segment_index"], s.meta["piece_index"]) for s in (first, second)] == [
        (0, 0),
        (0, 1),
    ]
    assert all(s.meta["num_segments"] == 1 and s.meta["num_pieces"] == 2 for s in (first, second))
    assert [s.weight for s in (first, second)] == [2.0, 2.0]
    assert second.meta["sample_id"] == f"{r.id}:t0:0.1"
    assert second.meta["parent_sample_id"] == first.meta["sample_id"] == f"{r.id}:t0:0"


@pytest.mark.parametrize("policy", ["share", "split", "own_reward"])
def test_own_reward_and_split_ignore_drift_pieces(policy: str) -> None:
    # drift, then an edit (snapshot reward -0.3 on call 1), then drift again in the final part:
    # segments {call 0 | call 1} and {call 2 | call 3}, each in two pieces.
    r = one_turn(
        ([1], [2]),
        ([1, 22], [3]),
        ([9], [4], EDIT),
        ([9, 44], [5]),
        info={1: {"snapshot_reward": -0.3}},
    )
    samples = build_samples([r], uniform_weights([r], 0.8), snapshot_policy=policy)  # type: ignore[arg-type]
    assert [s.input_ids for s in samples] == [(1, 2), (1, 22, 3), (9, 4), (9, 44, 5)]
    assert [s.meta["segment_index"] for s in samples] == [0, 0, 1, 1]
    assert [s.meta["is_snapshot"] for s in samples] == [False, True, False, False]
    assert [s.meta["drift_split"] for s in samples] == [True, False, True, False]
    expected = {
        "share": [0.8, 0.8, 0.8, 0.8],
        "split": [0.4, 0.4, 0.4, 0.4],  # k counts edits, not drift: 0.8 / 2
        "own_reward": [-0.3, -0.3, 0.8, 0.8],  # drift pieces keep their segment's reward
    }[policy]
    assert [s.weight for s in samples] == pytest.approx(expected, abs=1e-12)
    rewards = [s.meta["reward"] for s in samples]
    assert rewards == ([-0.3, -0.3, 1.0, 1.0] if policy == "own_reward" else [1.0] * 4)


def test_own_reward_with_drift_only_does_not_raise() -> None:
    # The failure the issue reports: a drift split used to be a snapshot without a reward.
    r = one_turn(([1], [2]), ([1, 22], [3]))
    samples = build_samples([r], uniform_weights([r], 0.5), snapshot_policy="own_reward")
    assert [(s.weight, s.meta["weight_source"]) for s in samples] == [(0.5, "credit")] * 2
    assert not any(s.meta["is_snapshot"] for s in samples)


def test_steps_without_a_context_version_are_judged_by_their_prompt_messages() -> None:
    user = {"role": "user", "content": "obs"}
    reply = {"role": "assistant", "content": "a"}
    # Same history, extended: drift. History cut: an edit. Nothing recorded: drift.
    appended = [
        call([1], [2], prompt_messages=(user,)),
        call([1, 9], [3], prompt_messages=(user, reply)),
    ]
    cut = [call([1], [2], prompt_messages=(user, reply)), call([5], [3], prompt_messages=(user,))]
    bare = [call([1], [2]), call([5], [3])]
    for steps, snapshot in ((appended, False), (cut, True), (bare, False)):
        r = Rollout(steps=[*steps, env_step("t0", reward=1.0)])
        first, _ = build_samples([r], uniform_weights([r]))
        assert (first.meta["is_snapshot"], first.meta["drift_split"]) == (snapshot, not snapshot)
