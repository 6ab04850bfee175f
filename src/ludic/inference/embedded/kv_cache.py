"""A left-padded batch KV cache that can grow, merge new rows and drop finished ones in place.

`GrowingLayer` keeps keys/values in buffers with spare rows and spare columns on both sides, so
a decode step writes one column in place (`DynamicLayer` re-allocates the whole cache with
`torch.cat`), merging new rows writes only those rows (widening the batch into the spare columns
on the left when they are longer), and dropping finished rows moves only the rows that fill
their slots. Only full-attention layers are supported; sliding-window or linear-attention caches
are refused.

Legend: B rows, H kv heads, T cached positions, D head dim.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ludic.inference.embedded.prefix_cache import CachedPrefix

_MIN_CAPACITY = 64
_MIN_ROWS = 8


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose `keys`/`values` are the views `[:rows, :, start:end]` of buffers with
    spare rows and columns."""

    def __init__(self) -> None:
        super().__init__()
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # keys, values [R, H, C, D]
        self._rows = self._start = self._end = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._buffers is None or self._end + new > self._buffers[0].shape[-2]:
            parts = [self.states()] if self._has_states() else []
            self._reallocate(len(key_states), parts, like=key_states, room=new)
        keys_BHCD, values_BHCD = self._buffers_or_fail()
        keys_BHCD[: self._rows, :, self._end : self._end + new] = key_states
        values_BHCD[: self._rows, :, self._end : self._end + new] = value_states
        self._end += new
        self._set_views()
        return self.states()

    def select(self, index_B: torch.Tensor, trim: int) -> None:
        """Keep rows `index_B` (in that order; repeats allowed), drop the first `trim` positions;
        copies the kept rows into fresh buffers with spare room."""
        keys, values = self.states()
        kept = (keys[index_B, :, trim:], values[index_B, :, trim:])
        self._reallocate(len(index_B), [kept], like=kept[0])

    def compact(self, order: Sequence[int], trim: int) -> None:
        """Keep rows `order` (slot s gets row order[s]) and drop the first `trim` positions, in
        place: only rows that change slot are copied (`compaction_order` moves the fewest), and
        no buffer is allocated."""
        if self._buffers is None:
            self.select(torch.tensor(order, device=self.device), trim)
            return
        self._start += trim
        moves = [(slot, row) for slot, row in enumerate(order) if slot != row]
        if moves:
            slots_M = torch.tensor([slot for slot, _ in moves], device=self.device)
            rows_M = torch.tensor([row for _, row in moves], device=self.device)
            for buffer_BHCD in self._buffers:
                used_BHTD = buffer_BHCD[: self._rows, :, self._start : self._end]
                used_BHTD.index_copy_(0, slots_M, used_BHTD.index_select(0, rows_M))
        self._rows = len(order)
        self._set_views()

    def append_rows(self, other: GrowingLayer, width: int) -> None:
        """Append `other`'s rows; both are left-padded to `width` positions (with zeros). In place
        when the buffers have the spare rows (and, for a wider batch, the spare columns on the
        left); otherwise into new buffers with spare room."""
        new_keys, new_values = other.states()
        rows, old_width = self._rows, self._end - self._start
        assert width >= max(old_width, new_keys.shape[-2]), "width must cover both row sets"
        buffers = self._buffers
        total = rows + len(new_keys)
        if buffers is None or total > buffers[0].shape[0] or self._start < width - old_width:
            parts = [self.states(), (new_keys, new_values)]
            self._reallocate(total, parts, like=new_keys, width=width, spare_rows=True)
            return
        self._start = self._end - width
        for buffer_BHCD, new_BHTD in zip(buffers, (new_keys, new_values), strict=True):
            if width > old_width:  # the old rows' new leading columns are padding
                buffer_BHCD[:rows, :, self._start : self._end - old_width].zero_()
            _place_right(
                buffer_BHCD[rows : rows + len(new_BHTD), :, self._start : self._end], new_BHTD
            )
        self._rows += len(new_keys)
        self._set_views()

    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached (keys, values) of the used positions."""
        assert self.keys is not None and self.values is not None, "empty cache layer"
        return self.keys, self.values

    def set_states(self, keys_BHTD: torch.Tensor, values_BHTD: torch.Tensor) -> None:
        """Replace the cached states (the next update moves them into buffers with spare room)."""
        self.dtype, self.device = keys_BHTD.dtype, keys_BHTD.device
        self.keys, self.values = keys_BHTD, values_BHTD
        self._buffers = None
        self._rows, self._start, self._end = len(keys_BHTD), 0, keys_BHTD.shape[-2]
        self.is_initialized = True

    def _has_states(self) -> bool:
        return self.keys is not None and self.keys.dim() == 4 and self.keys.shape[-2] > 0

    def _reallocate(
        self,
        rows: int,
        parts: list[tuple[torch.Tensor, torch.Tensor]],
        *,
        like: torch.Tensor,
        width: int | None = None,
        room: int = 0,
        spare_rows: bool = False,
    ) -> None:
        """New buffers holding `parts` (blocks of rows, in order, each right-aligned in `width`
        positions and zero-padded), with spare columns on both sides (at least `room` on the
        right), as many spare rows as used ones if `spare_rows`, and never fewer rows than the
        buffers they replace."""
        if width is None:
            width = max((keys.shape[-2] for keys, _ in parts), default=0)
        left = max(width // 2, 16)  # room to widen the batch when longer rows join
        capacity = left + width + max(width, room, _MIN_CAPACITY)
        row_capacity = max(2 * rows, _MIN_ROWS) if spare_rows else rows
        if self._buffers is not None:  # keep the spare rows a merge made
            row_capacity = max(row_capacity, len(self._buffers[0]))
        shape = (row_capacity, like.shape[1], capacity, like.shape[-1])
        keys_BHCD = like.new_empty(shape)
        values_BHCD = like.new_empty(shape)
        self._start, self._end = left, left + width
        row = 0
        for part in parts:
            n = len(part[0])
            for buffer_BHCD, part_BHTD in zip((keys_BHCD, values_BHCD), part, strict=True):
                _place_right(buffer_BHCD[row : row + n, :, self._start : self._end], part_BHTD)
            row += n
        self._buffers = (keys_BHCD, values_BHCD)
        self._rows = rows
        self._set_views()

    def _buffers_or_fail(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._buffers is not None, "cache layer has no buffers"
        return self._buffers

    def _set_views(self) -> None:
        keys_BHCD, values_BHCD = self._buffers_or_fail()
        self.keys = keys_BHCD[: self._rows, :, self._start : self._end]
        self.values = values_BHCD[: self._rows, :, self._start : self._end]


def new_cache(config: PretrainedConfig) -> DynamicCache:
    """An empty cache for `config` whose layers are all GrowingLayers."""
    cache = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise NotImplementedError(
                "the embedded engine batches only full-attention caches (DynamicLayer); this "
                f"model uses {type(layer).__name__}. Serve it with vLLM instead."
            )
        cache.layers[i] = GrowingLayer()
    return cache


def cache_kwarg(model: PreTrainedModel) -> str:
    """The keyword under which `model`'s forward takes its KV cache: `cache` from transformers
    5.x on (which deprecates `past_key_values`, to be removed in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _layers(cache: DynamicCache) -> list[GrowingLayer]:
    layers = [layer for layer in cache.layers if isinstance(layer, GrowingLayer)]
    assert len(layers) == len(cache.layers), "cache was not built by new_cache()"
    return layers


def pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """Zero-pad `x` on the left of `dim` up to `width`."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [missing, 0]
    return F.pad(x, pad)


def _place_right(into_BHWD: torch.Tensor, x_BHTD: torch.Tensor) -> None:
    """Write `x` at the last T positions of `into`, zeros before it (padding must hold finite
    values: attention weighs it by exactly 0)."""
    pad = into_BHWD.shape[-2] - x_BHTD.shape[-2]
    into_BHWD[:, :, :pad].zero_()
    into_BHWD[:, :, pad:].copy_(x_BHTD)


def merge_rows(cache: DynamicCache, fresh: DynamicCache, width: int) -> None:
    """Append `fresh`'s rows to `cache`, both left-padded to `width` positions."""
    for old, new in zip(_layers(cache), _layers(fresh), strict=True):
        old.append_rows(new, width)


def select_rows(cache: DynamicCache, index_B: torch.Tensor, trim: int) -> None:
    """Keep rows `index_B` (repeats allowed) and drop the first `trim` positions (padding in
    every kept row), into fresh buffers."""
    for layer in _layers(cache):
        layer.select(index_B, trim)


def compact_rows(cache: DynamicCache, order: Sequence[int], trim: int) -> None:
    """Keep rows `order` in place (see `GrowingLayer.compact`) and drop the first `trim`
    positions."""
    for layer in _layers(cache):
        layer.compact(order, trim)


def compaction_order(keep: Sequence[int]) -> list[int]:
    """Slot -> row that keeps the sorted rows `keep` with the fewest row moves: kept rows in the
    first len(keep) slots stay, the kept rows behind them fill the freed slots, last first."""
    n = len(keep)
    staying = {row for row in keep if row < n}
    movers = iter(sorted((row for row in keep if row >= n), reverse=True))
    return [slot if slot in staying else next(movers) for slot in range(n)]


def load_prefixes(cache: DynamicCache, prefixes: Sequence[CachedPrefix | None], width: int) -> None:
    """Fill an empty cache with cached prefixes, one row each, left-padded to `width`."""
    for i, layer in enumerate(_layers(cache)):
        keys, values = [], []
        for prefix in prefixes:
            assert prefix is not None, "every row of a prefix-hit prefill has a prefix"
            keys.append(pad_left(prefix.keys[i], width, -2))
            values.append(pad_left(prefix.values[i], width, -2))
        layer.set_states(torch.stack(keys), torch.stack(values))


def extract_prefix(
    cache: DynamicCache, mask_BT: torch.Tensor, row: int, ids: list[int]
) -> CachedPrefix | None:
    """Row `row`'s cached KV at its real (unmasked) positions, if they are exactly `ids`."""
    cols = mask_BT[row].nonzero().squeeze(-1)
    if len(cols) != len(ids) or not ids:
        return None
    keys, values = [], []
    for layer in _layers(cache):
        layer_keys, layer_values = layer.states()
        keys.append(layer_keys[row][:, cols])
        values.append(layer_values[row][:, cols])
    return CachedPrefix(ids=tuple(ids), keys=tuple(keys), values=tuple(values))
