"""Continuous batching over a Hugging Face causal LM with a left-padded DynamicCache.

New sequences are prefilled together (left-padded) and merged into the running batch by
left-padding the shorter KV cache; every step samples one token for every row, retires finished
rows and trims padding columns no row needs any more. Position ids are per row, so padding never
changes a row's numerics beyond float noise. A prompt extending a finished sequence reuses its
KV (`ludic.inference.embedded.prefix_cache`) and prefills only the new suffix; identical prompts admitted
together (a GRPO group) are prefilled once. After a failed step, `step_alone` decodes one row
by itself (re-prefilled from its prompt and completion so far, with the uniform the failed step
drew for it), so the engine can tell which request failed. It supports full-attention models
whose cache layers are plain `DynamicLayer`s (Llama, Qwen2/3, Mistral without sliding window);
no paged attention or speculative decoding. With `batch_invariant`, every row's logits are
bit for bit those it would get alone (`ludic.inference.embedded.batch_invariant`); a position's KV
is the same whether a prefill or a decode step computed it, so prefix reuse stays on.

Legend: B rows, T cached positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from transformers import DynamicCache, PreTrainedModel

from ludic.inference.embedded.kv_cache import (
    cache_kwarg,
    compact_rows,
    compaction_order,
    extract_prefix,
    load_prefixes,
    merge_rows,
    new_cache,
    pad_left,
    select_rows,
)
from ludic.inference.embedded.lean_forward import LeanForward
from ludic.inference.embedded.prefix_cache import CachedPrefix, PrefixCache
from ludic.inference.embedded.sequence import SequenceState, TextCodec
from ludic.inference.embedded.token_sampling import (
    LogprobsMode,
    RowKnobs,
    draw_uniforms,
    sample_tokens,
)


class DecodeBatch:
    """The running batch: rows, their KV cache, attention mask, positions and next logits."""

    def __init__(
        self,
        model: PreTrainedModel,
        codec: TextCodec,
        logprobs_mode: LogprobsMode = "processed",
        prefix_cache_tokens: int = 0,
        lean_forward: bool = True,
        batch_invariant: bool = False,
        prepacked_gemm: bool = False,
    ) -> None:
        self.model = model
        self._device = model.device  # `model.device` walks the parameters: once, not per step
        self._lean = LeanForward.for_model(model) if lean_forward else None
        if batch_invariant or prepacked_gemm:
            self._lean = _required_forward(model, lean_forward, batch_invariant, prepacked_gemm)
        self._sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self._cache_kwarg = cache_kwarg(model)
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.codec = codec
        self.logprobs_mode = logprobs_mode
        self.rows: list[SequenceState] = []
        self._knobs: RowKnobs | None = None  # the rows' sampling knobs, rebuilt when rows change
        self._cache: DynamicCache | None = None
        self._mask_BT = torch.zeros(0, 0, dtype=torch.long)
        self._positions_B = torch.zeros(0, dtype=torch.long)
        self._logits_BV = torch.zeros(0, 0)
        # The last step's rows, their positions then and the uniforms drawn for them: a row
        # whose step failed before recording its token gets that uniform again (`step_alone`).
        self._drawn: tuple[list[SequenceState], torch.Tensor, torch.Tensor] | None = None
        self._replay_B: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self._device

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def admit(self, new: Sequence[SequenceState]) -> None:
        """Prefill `new` sequences and add them to the batch.

        Prompts extending a cached finished sequence prefill only their new suffix. Prompts are
        grouped by (suffix) length so that padding stays under a quarter of each prefill.
        """
        found = {id(s): self.prefix_cache.lookup(s.context_ids) for s in new}
        misses = [s for s in new if found[id(s)] is None]
        hits = [s for s in new if found[id(s)] is not None]
        for group in _length_groups(misses, lambda s: len(s.context_ids)):
            self._prefill(group, [None] * len(group))
        for group in _length_groups(hits, lambda s: len(s.context_ids) - len(found[id(s)].ids)):  # type: ignore[union-attr]
            self._prefill(group, [found[id(s)] for s in group])

    def _prefill(self, new: list[SequenceState], prefixes: list[CachedPrefix | None]) -> None:
        """Prefill `new` and merge them into the batch. Identical prompts (a GRPO group, agents
        starting from one observation) are computed once and their KV copied to every row."""
        row_of: dict[tuple[int, ...], int] = {}  # prompt -> its row in the distinct prefill
        distinct: list[int] = []  # index in `new` of each distinct prompt's first request
        rows: list[int] = []
        for i, seq in enumerate(new):
            row = row_of.setdefault(tuple(seq.context_ids), len(distinct))
            if row == len(distinct):
                distinct.append(i)
            rows.append(row)
        cache, mask_BT, logits_BV = self._forward_prompts(
            [new[i] for i in distinct], [prefixes[i] for i in distinct]
        )
        if len(distinct) < len(new):
            index_B = torch.tensor(rows, device=self.device)
            select_rows(cache, index_B, trim=0)
            mask_BT, logits_BV = mask_BT[index_B], logits_BV[index_B]
        self._merge(cache, mask_BT, logits_BV, new)

    def _forward_prompts(
        self, new: list[SequenceState], prefixes: list[CachedPrefix | None]
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """Run the prompts (left-padded, after their cached prefixes): their cache, key mask
        and next-token logits."""
        cached = [0 if p is None else len(p.ids) for p in prefixes]
        suffixes = [s.context_ids[n:] for s, n in zip(new, cached, strict=True)]
        width_prefix, width_suffix = max(cached), max(map(len, suffixes))
        ids_BS = torch.zeros(len(new), width_suffix, dtype=torch.long)
        mask_BT = torch.zeros(len(new), width_prefix + width_suffix, dtype=torch.long)
        for row, (suffix, n) in enumerate(zip(suffixes, cached, strict=True)):
            ids_BS[row, width_suffix - len(suffix) :] = torch.tensor(suffix)
            mask_BT[row, width_prefix - n : width_prefix] = 1
            mask_BT[row, mask_BT.shape[1] - len(suffix) :] = 1
        ids_BS, mask_BT = ids_BS.to(self.device), mask_BT.to(self.device)
        cache = new_cache(self.model.config)
        if width_prefix:
            load_prefixes(cache, prefixes, width_prefix)
        positions_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        if self._lean is not None:
            logits_BV = self._lean(ids_BS, mask_BT, positions_BT[:, width_prefix:], cache)[:, -1]
        else:
            out = self.model(
                input_ids=ids_BS,
                attention_mask=mask_BT,
                position_ids=positions_BT[:, width_prefix:],
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kwarg: cache},
            )
            logits_BV = out.logits[:, -1].float()
        return cache, mask_BT, logits_BV

    def _merge(
        self,
        cache: DynamicCache,
        mask_BT: torch.Tensor,
        logits_BV: torch.Tensor,
        new: list[SequenceState],
    ) -> None:
        if self._cache is None or not self.rows:
            self._cache, self._mask_BT, self._logits_BV = cache, mask_BT, logits_BV
            self._positions_B = mask_BT.sum(-1)
            self._set_rows(list(new))
            return
        width = max(self._mask_BT.shape[1], mask_BT.shape[1])
        merge_rows(self._cache, cache, width)
        self._mask_BT = torch.cat(
            [pad_left(self._mask_BT, width, dim=1), pad_left(mask_BT, width, dim=1)]
        )
        self._positions_B = torch.cat([self._positions_B, mask_BT.sum(-1)])
        self._logits_BV = torch.cat([self._logits_BV, logits_BV])
        self._set_rows(self.rows + list(new))

    def _set_rows(self, rows: list[SequenceState]) -> None:
        self.rows = rows
        self._knobs = None

    @torch.inference_mode()
    def step(self) -> list[SequenceState]:
        """Sample one token for every row, retire finished rows, run the next forward pass.

        Returns the sequences that finished (or were cancelled) in this step.
        """
        if not self.rows:
            return []
        tokens_B = self._sample_and_record()
        keep = [i for i, seq in enumerate(self.rows) if not seq.done]
        finished = [seq for seq in self.rows if seq.done]
        if finished:
            self._remember([i for i, seq in enumerate(self.rows) if seq.finish_reason is not None])
            tokens_B = tokens_B[self._select(keep)]
        if self.rows:
            self._forward(tokens_B)
        return finished

    def _sample_and_record(self) -> torch.Tensor:
        rows = self.rows
        if self._knobs is None:
            self._knobs = RowKnobs.of(
                [s.temperature for s in rows],
                [s.top_k for s in rows],
                [s.top_p for s in rows],
                self._logits_BV.shape[-1],
                self.device,
            )
        logprobs_BV = self._knobs.logprobs(self._logits_BV)
        uniforms_B = self._replay_B
        if uniforms_B is None:
            uniforms_B = draw_uniforms([s.generator for s in rows])
        self._drawn = (rows, self._positions_B, uniforms_B)
        tokens_B = sample_tokens(logprobs_BV, uniforms_B, self._knobs.greedy_B)
        if self.logprobs_mode == "raw":
            logprobs_BV = torch.log_softmax(self._logits_BV.float(), dim=-1)
        forced = [seq.next_forced() for seq in rows]
        for row, token in enumerate(forced):
            if token is not None:
                tokens_B[row] = token
        chosen_B = logprobs_BV.gather(-1, tokens_B[:, None]).squeeze(-1)
        for row, (seq, token, logprob) in enumerate(
            zip(rows, tokens_B.tolist(), chosen_B.tolist(), strict=True)
        ):
            is_forced = forced[row] is not None
            # A forced token was sampled from a point mass: its processed logprob is 0.
            value = 0.0 if is_forced and self.logprobs_mode == "processed" else logprob
            seq.append(token, value, forced=is_forced, codec=self.codec)
        return tokens_B

    def weights_changed(self) -> None:
        """After the served weights changed: drop what was computed from the old ones (the
        lean forward's packed weights; the prefix cache is the engine's to clear)."""
        if self._lean is not None:
            self._lean.weights_changed()

    def unused_uniforms(self) -> dict[SequenceState, float]:
        """After a failed step: the uniform drawn for each row that did not record its token."""
        if self._drawn is None:
            return {}
        rows, positions_B, uniforms_B = self._drawn
        return {
            seq: u
            for seq, p, u in zip(rows, positions_B.tolist(), uniforms_B.tolist(), strict=True)
            if len(seq.prompt_ids) + len(seq.completion_ids) == p  # no token since the draw
        }

    def step_alone(self, seq: SequenceState, uniform: float | None = None) -> bool:
        """Admit `seq` (prompt and completion so far) and decode one step for it alone, drawing
        `uniform` if given, then merge it into the batch. True if it finished. When it raises,
        the batch is as it was and `seq` is left out."""
        outer = self._state()
        self.reset()
        try:
            self.admit([seq])
            if uniform is not None:
                self._replay_B = torch.tensor([uniform], dtype=torch.float64)
            finished = self.step()
        except BaseException:
            self._restore(outer)
            raise
        finally:
            self._replay_B = None
        alone = self._state()
        self._restore(outer)
        if alone.rows:
            assert alone.cache is not None
            self._merge(alone.cache, alone.mask_BT, alone.logits_BV, alone.rows)
        return bool(finished)

    def _state(self) -> _BatchState:
        return _BatchState(
            self.rows, self._knobs, self._cache, self._mask_BT, self._positions_B, self._logits_BV
        )

    def _restore(self, state: _BatchState) -> None:
        self.rows, self._knobs, self._cache = state.rows, state.knobs, state.cache
        self._mask_BT, self._positions_B = state.mask_BT, state.positions_B
        self._logits_BV = state.logits_BV

    def _remember(self, rows: list[int]) -> None:
        """Keep finished rows' KV (prompt + all but the last completion token) for reuse."""
        if self.prefix_cache.max_tokens <= 0 or self._cache is None:
            return
        for row in rows:
            seq = self.rows[row]
            entry = extract_prefix(
                self._cache, self._mask_BT, row, seq.prompt_ids + seq.completion_ids[:-1]
            )
            if entry is not None:
                self.prefix_cache.store(entry)

    def _select(self, keep: list[int]) -> list[int]:
        """Keep the sorted rows `keep`; rows from the back fill the freed slots (the fewest KV
        rows move). Returns the new order (slot -> old row)."""
        if not keep:
            self.reset()
            return []
        order = compaction_order(keep)
        index = torch.tensor(order, device=self.device)
        self._mask_BT = self._mask_BT[index]
        self._positions_B = self._positions_B[index]
        self._logits_BV = self._logits_BV[index]
        self._set_rows([self.rows[i] for i in order])
        # Columns that are padding in every remaining row can go.
        trim = int(self._mask_BT.argmax(dim=1).min())
        self._mask_BT = self._mask_BT[:, trim:]
        assert self._cache is not None
        compact_rows(self._cache, order, trim)
        return order

    def _forward(self, tokens_B: torch.Tensor) -> None:
        ones_B1 = torch.ones(len(self.rows), 1, dtype=self._mask_BT.dtype, device=self.device)
        self._mask_BT = torch.cat([self._mask_BT, ones_B1], dim=1)
        tokens_B1 = tokens_B[:, None].to(self.device)
        if self._lean is not None:
            assert self._cache is not None
            logits_B1V = self._lean(
                tokens_B1, self._mask_BT, self._positions_B[:, None], self._cache
            )
            self._positions_B = self._positions_B + 1
            self._logits_BV = logits_B1V[:, -1]
            return
        mask = self._mask_BT
        if self._sdpa:  # a ready 4D boolean mask skips transformers' per-step mask building
            mask = mask.bool()[:, None, None, :]
        out = self.model(
            input_ids=tokens_B1,
            attention_mask=mask,
            position_ids=self._positions_B[:, None],
            use_cache=True,
            **{self._cache_kwarg: self._cache},
        )
        self._positions_B = self._positions_B + 1
        self._logits_BV = out.logits[:, -1].float()

    def reset(self) -> list[SequenceState]:
        """Drop every row and the cache; returns the rows that were dropped."""
        rows = self.rows
        self._set_rows([])
        self._drawn = None
        self._cache = None
        self._mask_BT = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._positions_B = torch.zeros(0, dtype=torch.long, device=self.device)
        self._logits_BV = torch.zeros(0, 0, device=self.device)
        return rows


def _required_forward(
    model: PreTrainedModel, lean_forward: bool, batch_invariant: bool, prepacked_gemm: bool
) -> LeanForward:
    """The lean forward that `batch_invariant` or `prepacked_gemm` needs; ValueError naming the
    setting when it cannot be had."""
    flag = "batch_invariant" if batch_invariant else "prepacked_gemm"
    if not lean_forward:
        raise ValueError(
            f"{flag}=True runs the lean forward: drop lean_forward=False from the "
            f"EngineConfig, or turn {flag} off"
        )
    lean = LeanForward.build(model, batch_invariant=batch_invariant, prepacked=prepacked_gemm)
    if isinstance(lean, str) and batch_invariant:
        raise ValueError(
            f"batch_invariant=True cannot be honoured for this model here: {lean}. Turn "
            "batch_invariant off (results then depend slightly on what shares a batch), or use "
            "a Llama-family model on a machine where the check passes (on a CPU, e.g. fewer torch "
            "threads)"
        )
    if isinstance(lean, str):
        raise ValueError(
            f"prepacked_gemm=True cannot be honoured for this model here: {lean}. Turn "
            "prepacked_gemm off (the default GEMMs serve every model the engine takes)"
        )
    return lean


class _BatchState(NamedTuple):
    rows: list[SequenceState]
    knobs: RowKnobs | None
    cache: DynamicCache | None
    mask_BT: torch.Tensor
    positions_B: torch.Tensor
    logits_BV: torch.Tensor


def _length_groups(
    seqs: Sequence[SequenceState], length: Callable[[SequenceState], int], slack: float = 1.25
) -> list[list[SequenceState]]:
    """Split into groups (sorted by `length`) whose padded size is at most `slack` times their
    real token count."""
    groups: list[list[SequenceState]] = []
    group: list[SequenceState] = []
    real = 0
    for seq in sorted(seqs, key=length):
        n = length(seq)
        if group and (len(group) + 1) * n > slack * (real + n):
            groups.append(group)
            group, real = [], 0
        group.append(seq)
        real += n
    if group:
        groups.append(group)
    return groups
