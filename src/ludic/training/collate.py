"""SAWItems to tensors: `max_seq_len` capping, right-padded collation, micro-batch planning by a
token budget, and packing of several sequences into one row for the forward pass.

It does not run the model or compute losses (see `logprobs.py` and `gradients.py`). Packing is a
compute layout only: losses always see one padded row per sequence.

Shape legend: B = sequences, T = padded tokens, L = tokens of one packed row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ludic.rollouts.samples import SAWItem

MAX_SEQ_LEN_REASON = "max_seq_len"


def cap_seq_len(items: Sequence[SAWItem], max_seq_len: int | None) -> list[SAWItem]:
    """Cut every sequence longer than `max_seq_len` to its first `max_seq_len` tokens.

    A capped item is a new item (items are frozen) whose meta gains `seq_len_truncated=True`,
    `seq_len_original` and `seq_len_kept`; when it has no episode-level `truncation_reason` it
    also gets `truncated=True` and `truncation_reason="max_seq_len"`. Items that fit are
    returned as they are.
    """
    if max_seq_len is None:
        return list(items)
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be >= 2 (a context and one action), got {max_seq_len}")
    out: list[SAWItem] = []
    for item in items:
        n = item.num_tokens
        if n <= max_seq_len:
            out.append(item)
            continue
        meta = {
            **item.meta,
            "seq_len_truncated": True,
            "seq_len_original": n,
            "seq_len_kept": max_seq_len,
        }
        if meta.get("truncation_reason") is None:
            meta["truncated"] = True
            meta["truncation_reason"] = MAX_SEQ_LEN_REASON
        lp = item.behavior_logprobs
        out.append(
            replace(
                item,
                input_ids=item.input_ids[:max_seq_len],
                action_mask=item.action_mask[:max_seq_len],
                behavior_logprobs=None if lp is None else lp[:max_seq_len],
                meta=meta,
            )
        )
    return out


def trainable_action_tokens(item: SAWItem) -> int:
    """Action tokens a causal LM can train on: position 0 has no context, so it never counts."""
    return sum(item.action_mask[1:])


@dataclass(frozen=True, kw_only=True, slots=True)
class CollatedBatch:
    """Right-padded tensors for B sequences.

    `attention_mask_BT` is 1 on real tokens. `action_mask_BT` (float) is 1 on trained tokens and
    always 0 at position 0 and on padding. `behavior_logprobs_BT` is None unless every item has
    behaviour logprobs. `advantages_B` holds each item's weight.
    """

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    action_mask_BT: torch.Tensor
    advantages_B: torch.Tensor
    behavior_logprobs_BT: torch.Tensor | None = None

    @property
    def num_sequences(self) -> int:
        return int(self.input_ids_BT.shape[0])

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask_BT.sum().item())

    @property
    def lengths_B(self) -> torch.Tensor:
        return self.attention_mask_BT.sum(dim=-1)

    def select(self, rows: Sequence[int]) -> CollatedBatch:
        """The given rows, with padding trimmed to the longest selected sequence."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        width = max(1, int(self.lengths_B[index].max().item()))
        lp = self.behavior_logprobs_BT
        return CollatedBatch(
            input_ids_BT=self.input_ids_BT[index, :width],
            attention_mask_BT=self.attention_mask_BT[index, :width],
            action_mask_BT=self.action_mask_BT[index, :width],
            advantages_B=self.advantages_B[index],
            behavior_logprobs_BT=None if lp is None else lp[index, :width],
        )

    def to(self, device: torch.device | str) -> CollatedBatch:
        lp = self.behavior_logprobs_BT
        return CollatedBatch(
            input_ids_BT=self.input_ids_BT.to(device),
            attention_mask_BT=self.attention_mask_BT.to(device),
            action_mask_BT=self.action_mask_BT.to(device),
            advantages_B=self.advantages_B.to(device),
            behavior_logprobs_BT=None if lp is None else lp.to(device),
        )


def collate(items: Sequence[SAWItem], *, pad_token_id: int = 0) -> CollatedBatch:
    """Right-pad `items` into a `CollatedBatch` (float32 masks, logprobs and advantages)."""
    if not items:
        raise ValueError("collate: no items; skip empty batches before collating")
    width = max(item.num_tokens for item in items)
    if width == 0:
        raise ValueError("collate: every item is empty (0 tokens)")
    b = len(items)
    input_ids_BT = torch.full((b, width), pad_token_id, dtype=torch.long)
    attention_mask_BT = torch.zeros((b, width), dtype=torch.long)
    action_mask_BT = torch.zeros((b, width), dtype=torch.float32)
    with_lp = all(item.behavior_logprobs is not None for item in items)
    behavior_BT = torch.zeros((b, width), dtype=torch.float32) if with_lp else None
    for row, item in enumerate(items):
        n = item.num_tokens
        input_ids_BT[row, :n] = torch.tensor(item.input_ids, dtype=torch.long)
        attention_mask_BT[row, :n] = 1
        action_mask_BT[row, :n] = torch.tensor(item.action_mask, dtype=torch.float32)
        if behavior_BT is not None and item.behavior_logprobs is not None:
            behavior_BT[row, :n] = torch.tensor(item.behavior_logprobs, dtype=torch.float32)
    action_mask_BT[:, 0] = 0.0  # no context predicts the first token
    if behavior_BT is not None:  # 0.0 off the action mask, whatever the item held there
        behavior_BT = torch.where(action_mask_BT > 0, behavior_BT, torch.zeros_like(behavior_BT))
    return CollatedBatch(
        input_ids_BT=input_ids_BT,
        attention_mask_BT=attention_mask_BT,
        action_mask_BT=action_mask_BT,
        advantages_B=torch.tensor([item.weight for item in items], dtype=torch.float32),
        behavior_logprobs_BT=behavior_BT,
    )


def plan_micro_batches(
    lengths: Sequence[int], micro_batch_tokens: int | None, *, packed: bool = False
) -> list[list[int]]:
    """Split rows, in order, into micro-batches that fit `micro_batch_tokens`.

    Padded layout: a micro-batch costs rows x its longest row (padding counts). Packed layout:
    it costs the sum of its lengths. Greedy and sort-free, so the plan is deterministic and keeps
    the batch order; a row longer than the budget gets a micro-batch of its own. None puts
    every row in one micro-batch.
    """
    if not lengths:
        return []
    if micro_batch_tokens is None:
        return [list(range(len(lengths)))]
    if micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {micro_batch_tokens}")
    plan: list[list[int]] = [[]]
    longest = total = 0
    for row, n in enumerate(lengths):
        current = plan[-1]
        new_longest, new_total = max(longest, n), total + n
        cost = new_total if packed else new_longest * (len(current) + 1)
        if current and cost > micro_batch_tokens:
            plan.append([])
            new_longest, new_total = n, n
        plan[-1].append(row)
        longest, total = new_longest, new_total
    return plan


@dataclass(frozen=True, kw_only=True, slots=True)
class PackedRow:
    """Sequences laid end to end in one row for the model.

    `position_ids_1L` restart at 0 for each sequence, which makes Hugging Face models attend
    within each sequence only (packed-sequence masking, given no attention mask). `index_BT`
    maps each padded (b, t) slot to its position in the row (0 on padding).
    """

    input_ids_1L: torch.Tensor
    position_ids_1L: torch.Tensor
    index_BT: torch.Tensor


def pack(batch: CollatedBatch) -> PackedRow:
    """Pack the real tokens of every row of `batch` into one row."""
    lengths = [int(n) for n in batch.lengths_B.tolist()]
    device = batch.input_ids_BT.device
    ids, positions = [], []
    index_BT = torch.zeros_like(batch.input_ids_BT)
    offset = 0
    for row, n in enumerate(lengths):
        ids.append(batch.input_ids_BT[row, :n])
        positions.append(torch.arange(n, device=device))
        index_BT[row, :n] = torch.arange(offset, offset + n, device=device)
        offset += n
    return PackedRow(
        input_ids_1L=torch.cat(ids).unsqueeze(0),
        position_ids_1L=torch.cat(positions).unsqueeze(0),
        index_BT=index_BT,
    )
