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
