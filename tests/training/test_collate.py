"""Collation, masking, max_seq_len capping, micro-batch planning and packing layout."""

from __future__ import annotations

import pytest
import torch
from training_fakes import item

from ludic.rollouts.samples import SAWItem
from ludic.training import cap_seq_len, collate, pack, plan_micro_batches


def test_collate_right_pads_and_masks() -> None:
    a = SAWItem(
        input_ids=(5, 6, 7), action_mask=(0, 1, 1), weight=2.0, behavior_logprobs=(0.0, -1.0, -2.0)
    )
    b = SAWItem(input_ids=(8, 9), action_mask=(1, 1), weight=-1.0, behavior_logprobs=(-3.0, -4.0))
    batch = collate([a, b], pad_token_id=0)
    assert batch.input_ids_BT.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch.attention_mask_BT.tolist() == [[1, 1, 1], [1, 1, 0]]
    # Position 0 has no context: never trained on, even when the item marks it.
    assert batch.action_mask_BT.tolist() == [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]
    assert batch.behavior_logprobs_BT is not None
    assert batch.behavior_logprobs_BT.tolist() == [[0.0, -1.0, -2.0], [0.0, -4.0, 0.0]]
    assert batch.advantages_B.tolist() == [2.0, -1.0]
    assert batch.num_action_tokens == 3 and batch.num_sequences == 2
    assert batch.lengths_B.tolist() == [3, 2]


def test_collate_drops_behaviour_logprobs_unless_every_item_has_them() -> None:
    batch = collate([item(4), item(5, logprobs=False)])
    assert batch.behavior_logprobs_BT is None


def test_collate_refuses_empty_batch() -> None:
    with pytest.raises(ValueError, match="no items"):
        collate([])


def test_select_trims_padding_to_selected_rows() -> None:
    batch = collate([item(10), item(3), item(4)])
    sub = batch.select([1, 2])
    assert sub.input_ids_BT.shape == (2, 4)
    assert torch.equal(sub.input_ids_BT[0, :3], batch.input_ids_BT[1, :3])


def test_cap_seq_len_marks_meta_and_keeps_episode_reason() -> None:
    plain = item(10, prompt=3)
    episode_cut = item(10, prompt=3, truncated=True, truncation_reason="max_steps")
    short = item(4)
    out = cap_seq_len([plain, episode_cut, short], 6)
    capped, kept_reason, untouched = out
    assert capped.input_ids == plain.input_ids[:6] and capped.action_mask == plain.action_mask[:6]
    assert capped.behavior_logprobs == plain.behavior_logprobs[:6]  # type: ignore[index]
    assert capped.meta["seq_len_truncated"] is True
    assert capped.meta["seq_len_original"] == 10 and capped.meta["seq_len_kept"] == 6
    assert capped.meta["truncated"] is True and capped.meta["truncation_reason"] == "max_seq_len"
    assert kept_reason.meta["truncation_reason"] == "max_steps"
    assert kept_reason.meta["seq_len_truncated"] is True
    assert untouched is short
    assert "seq_len_truncated" not in plain.meta  # the original item is unchanged
    assert cap_seq_len([plain], None)[0] is plain


def test_cap_seq_len_rejects_tiny_cap() -> None:
    with pytest.raises(ValueError, match="max_seq_len"):
        cap_seq_len([item(4)], 1)


def test_plan_padded_counts_padding() -> None:
    # Budget 12: [4, 4, 4] costs 3 * 4 = 12; adding 5 would cost 4 * 5 = 20.
    assert plan_micro_batches([4, 4, 4, 5, 2, 9], 12) == [[0, 1, 2], [3, 4], [5]]
    # A row longer than the budget gets its own micro-batch.
    assert plan_micro_batches([3, 30, 3], 10) == [[0], [1], [2]]
    assert plan_micro_batches([3, 4], None) == [[0, 1]]
    assert plan_micro_batches([], 10) == []


def test_plan_packed_counts_tokens() -> None:
    assert plan_micro_batches([4, 4, 4, 5, 2, 9], 12, packed=True) == [[0, 1, 2], [3, 4], [5]]
    assert plan_micro_batches([6, 1, 5, 2], 7, packed=True) == [[0, 1], [2, 3]]


def test_plan_is_a_partition_in_order() -> None:
    lengths = [7, 3, 11, 2, 2, 9, 4, 4, 15, 1]
    for budget in (1, 8, 16, 40):
        plan = plan_micro_batches(lengths, budget)
        assert [r for mb in plan for r in mb] == list(range(len(lengths)))
        for mb in plan:
            assert len(mb) == 1 or len(mb) * max(lengths[r] for r in mb) <= budget


def test_pack_lays_sequences_end_to_end() -> None:
    batch = collate([item(3), item(2)])
    row = pack(batch)
    assert row.input_ids_1L.tolist() == [
        batch.input_ids_BT[0].tolist() + batch.input_ids_BT[1, :2].tolist()
    ]
    assert row.position_ids_1L.tolist() == [[0, 1, 2, 0, 1]]
    assert row.index_BT.tolist() == [[0, 1, 2], [3, 4, 0]]


# -- sampling transform and forced tokens from sample meta ----------------------------------------


def _sample(meta: dict[str, object], mask: tuple[int, ...] = (0, 0, 1, 1, 0, 1, 1)) -> SAWItem:
    n = len(mask)
    return SAWItem(
        input_ids=tuple(range(1, n + 1)),
        action_mask=mask,
        weight=1.0,
        behavior_logprobs=tuple(-0.5 if m else 0.0 for m in mask),
        meta=meta,
    )


def test_collate_lays_each_action_tokens_sampling_transform_out_per_token() -> None:
    # item 0: one transform for all actions; item 1: runs (2 tokens greedy + top-k 5, then
    # 2 tokens at 1.5); item 2: none recorded (the identity)
    runs = [
        {"temperature": 0.0, "top_k": 5, "top_p": 1.0, "tokens": 2},
        {"temperature": 1.5, "top_k": -1, "top_p": 1.0, "tokens": 2},
    ]
    batch = collate(
        [
            _sample({"behavior_sampling": {"temperature": 0.7, "top_k": -1, "top_p": 0.9}}),
            _sample({"behavior_sampling": runs}),
            _sample({}),
        ]
    )
    s = batch.sampling
    assert s is not None
    expected_temperature = [
        [1, 1, 0.7, 0.7, 1, 0.7, 0.7],
        [1, 1, 1, 1, 1, 1.5, 1.5],  # greedy counts as temperature 1
        [1] * 7,
    ]
    torch.testing.assert_close(s.temperature_BT, torch.tensor(expected_temperature))
    assert s.top_k_BT.tolist() == [[-1] * 7, [-1, -1, 5, 5, -1, -1, -1], [-1] * 7]
    expected_top_p = [[1, 1, 0.9, 0.9, 1, 0.9, 0.9], [1] * 7, [1] * 7]
    torch.testing.assert_close(s.top_p_BT, torch.tensor(expected_top_p))
    chosen = batch.select([1])
    assert chosen.sampling is not None
    assert chosen.sampling.top_k_BT.tolist() == [[-1, -1, 5, 5, -1, -1, -1]]


def test_collate_without_a_transform_has_no_sampling_tensors() -> None:
    identity = {"temperature": 1.0, "top_k": -1, "top_p": 1.0}
    assert collate([_sample({}), _sample({"behavior_sampling": identity})]).sampling is None


def test_forced_tokens_leave_the_action_mask() -> None:
    # action tokens at positions 2, 3, 5, 6; ordinals 1 and 3 were forced (max_think)
    batch = collate([_sample({"forced_action_tokens": [1, 3]})])
    assert batch.action_mask_BT.tolist() == [[0, 0, 1, 0, 0, 1, 0]]
    assert batch.behavior_logprobs_BT is not None
    assert batch.behavior_logprobs_BT.tolist() == [[0, 0, -0.5, 0, 0, -0.5, 0]]


def test_runs_that_miss_action_tokens_are_refused() -> None:
    runs = [{"temperature": 0.7, "top_k": -1, "top_p": 1.0, "tokens": 3}]
    with pytest.raises(ValueError, match="covers 3 action tokens but the sample has 4"):
        collate([_sample({"behavior_sampling": runs, "sample_id": "s"})])
