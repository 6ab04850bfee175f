"""SAWItems to tensors: `max_seq_len` capping, right-padded collation, micro-batch planning by a
token budget, and packing of several sequences into one row for the forward pass.

It does not run the model or compute losses (see `logprobs.py` and `gradients.py`). Packing is a
compute layout only: losses always see one padded row per sequence. The sampling transform each
action token was drawn under (sample meta `behavior_sampling`) becomes per-token tensors, and
tokens the backend forced (`forced_action_tokens`) leave the action mask.

Shape legend: B = sequences, T = padded tokens, L = tokens of one packed row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ludic.errors import LudicUsageError
from ludic.rollouts.samples import FORCED_ACTION_TOKENS_KEY, SAWItem, sampling_runs

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
class TokenSampling:
    """Per-token sampling transform, aligned with `input_ids_BT`: `[b, t]` describes the
    distribution token t was drawn from (`ludic.types.BehaviorSampling`). Temperature 0
    (greedy) is stored as 1; top_k -1 and top_p 1 are off; prompt tokens and padding carry
    the identity (1, -1, 1)."""

    temperature_BT: torch.Tensor
    top_k_BT: torch.Tensor
    top_p_BT: torch.Tensor

    def select(self, index: torch.Tensor, width: int) -> TokenSampling:
        return TokenSampling(
            temperature_BT=self.temperature_BT[index, :width],
            top_k_BT=self.top_k_BT[index, :width],
            top_p_BT=self.top_p_BT[index, :width],
        )

    def to(self, device: torch.device | str) -> TokenSampling:
        return TokenSampling(
            temperature_BT=self.temperature_BT.to(device),
            top_k_BT=self.top_k_BT.to(device),
            top_p_BT=self.top_p_BT.to(device),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CollatedBatch:
    """Right-padded tensors for B sequences.

    `attention_mask_BT` is 1 on real tokens. `action_mask_BT` (float) is 1 on trained tokens and
    always 0 at position 0, on padding and on forced tokens. `behavior_logprobs_BT` is None
    unless every item has behaviour logprobs. `advantages_B` holds each item's weight.
    `sampling` is None when every token was sampled at temperature 1 without top-k / top-p.
    """

    input_ids_BT: torch.Tensor
    attention_mask_BT: torch.Tensor
    action_mask_BT: torch.Tensor
    advantages_B: torch.Tensor
    behavior_logprobs_BT: torch.Tensor | None = None
    sampling: TokenSampling | None = None

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
            sampling=None if self.sampling is None else self.sampling.select(index, width),
        )

    def to(self, device: torch.device | str) -> CollatedBatch:
        lp = self.behavior_logprobs_BT
        return CollatedBatch(
            input_ids_BT=self.input_ids_BT.to(device),
            attention_mask_BT=self.attention_mask_BT.to(device),
            action_mask_BT=self.action_mask_BT.to(device),
            advantages_B=self.advantages_B.to(device),
            behavior_logprobs_BT=None if lp is None else lp.to(device),
            sampling=None if self.sampling is None else self.sampling.to(device),
        )


def collate(
    items: Sequence[SAWItem], *, pad_token_id: int = 0, vocab_size: int | None = None
) -> CollatedBatch:
    """Right-pad `items` into a `CollatedBatch` (float32 masks, logprobs and advantages).
    `vocab_size` (the model's embedding rows): a token id outside it is refused, naming the
    sample, instead of an IndexError deep in the model's embedding."""
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
    if vocab_size is not None:
        _check_token_ids(items, input_ids_BT, attention_mask_BT, vocab_size)
    sampling = _token_sampling(items, action_mask_BT)  # also unmasks forced tokens
    action_mask_BT[:, 0] = 0.0  # no context predicts the first token
    if behavior_BT is not None:  # 0.0 off the action mask, whatever the item held there
        behavior_BT = torch.where(action_mask_BT > 0, behavior_BT, torch.zeros_like(behavior_BT))
    return CollatedBatch(
        input_ids_BT=input_ids_BT,
        attention_mask_BT=attention_mask_BT,
        action_mask_BT=action_mask_BT,
        advantages_B=torch.tensor([item.weight for item in items], dtype=torch.float32),
        behavior_logprobs_BT=behavior_BT,
        sampling=sampling,
    )


def embedding_rows(model: torch.nn.Module) -> int | None:
    """How many token ids `model`'s input embedding has (None: a model without one, or one
    transformers cannot find it in: its `get_input_embeddings` raises NotImplementedError)."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        embedding = get() if callable(get) else None
    except NotImplementedError:
        return None
    rows = getattr(embedding, "num_embeddings", None)
    return int(rows) if isinstance(rows, int) else None


def _check_token_ids(
    items: Sequence[SAWItem],
    input_ids_BT: torch.Tensor,
    attention_mask_BT: torch.Tensor,
    vocab_size: int,
) -> None:
    """Refuse a sample holding a token id the model has no embedding for: its tokens come from
    another tokenizer than the trained model's (an actor or server on another model)."""
    outside_BT = ((input_ids_BT < 0) | (input_ids_BT >= vocab_size)) & (attention_mask_BT > 0)
    if not bool(outside_BT.any()):
        return
    row = int(outside_BT.any(dim=1).nonzero()[0, 0])
    token = int(input_ids_BT[row][outside_BT[row]][0])
    meta = items[row].meta
    name = meta.get("sample_id") or meta.get("rollout_id") or f"#{row} of the batch"
    raise LudicUsageError(
        f"sample {name} holds token id {token}, outside the trained model's vocabulary of "
        f"{vocab_size} ids: its tokens come from another tokenizer, so another model generated "
        "it. Generate with the model being trained (`ludic actor` / `ludic serve` on the "
        "learner's --model)"
    )


def _token_sampling(items: Sequence[SAWItem], action_mask_BT: torch.Tensor) -> TokenSampling | None:
    """Per-token transforms from each item's `behavior_sampling` runs (None when all are the
    identity), and forced tokens (`forced_action_tokens`) removed from `action_mask_BT`."""
    b, width = action_mask_BT.shape
    temperature_BT = torch.ones((b, width), dtype=torch.float32)
    top_k_BT = torch.full((b, width), -1, dtype=torch.long)
    top_p_BT = torch.ones((b, width), dtype=torch.float32)
    transformed = False
    for row, item in enumerate(items):
        runs, forced = sampling_runs(item.meta), item.meta.get(FORCED_ACTION_TOKENS_KEY, ())
        if not forced and all(sampling.is_identity for sampling, _ in runs):
            continue
        positions = [t for t, m in enumerate(item.action_mask) if m]
        for ordinal in forced:
            if ordinal < len(positions):  # beyond: cut by max_seq_len
                action_mask_BT[row, positions[ordinal]] = 0.0
        start = 0
        for run, (sampling, tokens) in enumerate(runs):
            end = len(positions) if tokens is None else start + tokens
            if run == len(runs) - 1 and end < len(positions):
                raise ValueError(
                    f"sample {item.meta.get('sample_id')!r}: meta 'behavior_sampling' covers {end} "
                    f"action tokens but the sample has {len(positions)}; the runs' 'tokens' must "
                    "add up to the sample's action tokens"
                )
            if not sampling.is_identity:
                span = torch.tensor(positions[start:end], dtype=torch.long)
                temperature_BT[row, span] = sampling.temperature or 1.0  # greedy counts as 1
                top_k_BT[row, span] = sampling.top_k
                top_p_BT[row, span] = sampling.top_p
                transformed = True
            start = end
    if not transformed:
        return None
    return TokenSampling(temperature_BT=temperature_BT, top_k_BT=top_k_BT, top_p_BT=top_p_BT)


@dataclass(frozen=True, kw_only=True, slots=True)
class RowGroup:
    """Rows of a batch whose first `shared_tokens` tokens (ids and sampling transform) are the
    same, so a forward can compute them once (`ludic.training.shared_prefix`); 0 when the rows
    share nothing worth computing once (then `rows` is a single row)."""

    rows: tuple[int, ...]
    shared_tokens: int = 0


def shared_prefix_groups(batch: CollatedBatch, *, min_tokens: int) -> list[RowGroup]:
    """Every row of `batch` in exactly one group, groups in order of their first row.

    Rows share a prefix when their prompt, the tokens before the first trained token, is the
    same token for token (a GRPO group: G completions of one prompt; a multi-turn row shares
    only its first prompt). The group then shares the longest prefix common to all its rows in
    ids and sampling transform (it may run into identical first completion tokens), capped at
    the shortest row. Groups of one row, or sharing fewer than `min_tokens` tokens, become
    single rows with `shared_tokens=0`.
    """
    if min_tokens < 2:
        raise ValueError(
            f"min_tokens must be >= 2 (a shared token and its context), got {min_tokens}"
        )
    ids_BT = batch.input_ids_BT.cpu()
    lengths = [int(n) for n in batch.lengths_B.tolist()]
    trained_BT = (batch.action_mask_BT > 0).cpu()
    first = torch.where(
        trained_BT.any(dim=1), trained_BT.int().argmax(dim=1), batch.lengths_B.cpu()
    )
    buckets: dict[bytes, list[int]] = {}
    for row, start in enumerate(first.tolist()):
        buckets.setdefault(ids_BT[row, :start].numpy().tobytes(), []).append(row)
    groups: list[RowGroup] = []
    for rows in buckets.values():
        shared = _common_prefix(batch, rows, lengths) if len(rows) > 1 else 0
        if shared >= min_tokens:
            groups.append(RowGroup(rows=tuple(rows), shared_tokens=shared))
        else:
            groups.extend(RowGroup(rows=(row,)) for row in rows)
    groups.sort(key=lambda group: group.rows[0])
    return groups


def _common_prefix(batch: CollatedBatch, rows: list[int], lengths: list[int]) -> int:
    """Leading positions where every row of `rows` has the same id and sampling transform."""
    width = min(lengths[row] for row in rows)
    index = torch.as_tensor(rows, dtype=torch.long)
    planes = [batch.input_ids_BT]
    if batch.sampling is not None:
        sampling = batch.sampling
        planes += [sampling.temperature_BT, sampling.top_k_BT, sampling.top_p_BT]
    same_W = torch.ones(width, dtype=torch.bool)
    for plane_BT in planes:
        sub_RW = plane_BT[index.to(plane_BT.device), :width].cpu()
        same_W &= (sub_RW == sub_RW[:1]).all(dim=0)
    differ = (~same_W).nonzero()
    return int(differ[0, 0]) if differ.numel() else width


@dataclass(slots=True)
class _Cost:
    """What a micro-batch computes. With its shared prefixes run once: `prefixes` prefix rows
    (`shared_tokens - 1` tokens each; the last shared token runs with every row) and `rows`
    rows of their remaining tokens; per row: `rows` rows of their whole length. The forward
    takes whichever is cheaper (`shared_prefix_pays`), so the micro-batch costs that."""

    prefixes: int = 0
    longest_prefix: int = 0
    prefix_tokens: int = 0
    rows: int = 0
    longest_rest: int = 0
    rest_tokens: int = 0
    longest_row: int = 0
    saved: int = 0  # prefix tokens the shared path does not recompute (packed)

    def add(self, other: _Cost) -> _Cost:
        return _Cost(
            prefixes=self.prefixes + other.prefixes,
            longest_prefix=max(self.longest_prefix, other.longest_prefix),
            prefix_tokens=self.prefix_tokens + other.prefix_tokens,
            rows=self.rows + other.rows,
            longest_rest=max(self.longest_rest, other.longest_rest),
            rest_tokens=self.rest_tokens + other.rest_tokens,
            longest_row=max(self.longest_row, other.longest_row),
            saved=self.saved + other.saved,
        )

    def shared(self, packed: bool) -> int:
        """Tokens the shared path computes: prefix rows (K x W padded) plus rest rows (B x S
        padded, S the longest rest over every row of the micro-batch)."""
        if packed:
            return self.prefix_tokens + self.rest_tokens
        return self.prefixes * self.longest_prefix + self.rows * self.longest_rest

    def per_row(self, packed: bool) -> int:
        """Tokens the per-row path computes (B x T padded; the lengths' sum packed)."""
        if packed:
            return self.prefix_tokens + self.rest_tokens + self.saved
        return self.rows * self.longest_row

    def tokens(self, packed: bool) -> int:
        return min(self.shared(packed), self.per_row(packed))


def _cost(rows: Sequence[int], lengths: Sequence[int], shared_tokens: int) -> _Cost:
    # a run of one row of a split group shares with nothing in its micro-batch: it runs whole
    prefix = max(0, shared_tokens - 1) if len(rows) > 1 else 0
    rests = [lengths[row] - prefix for row in rows]
    return _Cost(
        prefixes=int(prefix > 0),
        longest_prefix=prefix,
        prefix_tokens=prefix,
        rows=len(rows),
        longest_rest=max(rests),
        rest_tokens=sum(rests),
        longest_row=max(lengths[row] for row in rows),
        saved=prefix * (len(rows) - 1),
    )


def shared_prefix_pays(lengths: Sequence[int], groups: Sequence[RowGroup], *, packed: bool) -> bool:
    """True when running `groups`' shared prefixes once computes fewer tokens than running
    every row whole: some group shares a prefix and, padded, K x W + B x S < B x T (an
    ungrouped long row widens every rest row to its length, which can cost more than the
    prefixes save)."""
    if not any(group.shared_tokens >= 2 for group in groups):
        return False
    cost = _Cost()
    for group in groups:
        cost = cost.add(_cost(group.rows, lengths, group.shared_tokens))
    return cost.shared(packed) < cost.per_row(packed)


def plan_micro_batches(
    lengths: Sequence[int],
    micro_batch_tokens: int | None,
    *,
    packed: bool = False,
    groups: Sequence[RowGroup] | None = None,
) -> list[list[int]]:
    """Split rows into micro-batches that fit `micro_batch_tokens`.

    Padded layout: a micro-batch costs rows x its longest row (padding counts). Packed layout:
    it costs the sum of its lengths. With `groups` (`shared_prefix_groups`), a group's shared
    prefix counts once (as `shared_prefix_logprobs` computes it) and a group is never split
    while it fits the budget on its own; a group that does not is cut into consecutive runs of
    its rows that each fit, and each run computes the prefix again. Greedy and sort-free, so the
    plan is deterministic and keeps the order (of the groups, then of the rows in a group); a
    row longer than the budget gets a micro-batch of its own. None puts every row in one
    micro-batch.
    """
    if not lengths:
        return []
    if groups is None:
        groups = [RowGroup(rows=(row,)) for row in range(len(lengths))]
    if micro_batch_tokens is None:
        return [[row for group in groups for row in group.rows]]
    if micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1 or None, got {micro_batch_tokens}")
    budget = micro_batch_tokens
    plan: list[list[int]] = []
    current: list[int] = []
    cost = _Cost()
    for group in groups:
        whole = _cost(group.rows, lengths, group.shared_tokens)
        joins = cost.add(whole).tokens(packed) <= budget or not current
        if joins and (whole.tokens(packed) <= budget or len(group.rows) == 1):
            current, cost = current + list(group.rows), cost.add(whole)
            continue
        if current:
            plan.append(current)
            current, cost = [], _Cost()
        if whole.tokens(packed) <= budget:
            current, cost = list(group.rows), whole
            continue
        run: list[int] = []  # the group alone is over budget: runs of its rows
        for row in group.rows:
            if run and _cost([*run, row], lengths, group.shared_tokens).tokens(packed) > budget:
                plan.append(run)
                run = []
            run.append(row)
        current, cost = run, _cost(run, lengths, group.shared_tokens)
    if current:
        plan.append(current)
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
