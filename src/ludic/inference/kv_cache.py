"""A left-padded batch KV cache that can grow, merge new rows and drop finished ones.

`GrowingLayer` keeps keys/values in a buffer with spare room, so a decode step writes one column
in place instead of re-allocating the whole cache as `DynamicLayer` does with `torch.cat`. Only
full-attention layers are supported; sliding-window or linear-attention caches are refused.

Legend: B rows, H kv heads, T cached positions, D head dim.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer

from ludic.inference.prefix_cache import CachedPrefix

_MIN_CAPACITY = 64


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose `keys`/`values` are views into buffers with spare capacity."""

    def __init__(self) -> None:
        super().__init__()
        self._keys_BHTD: torch.Tensor | None = None
        self._values_BHTD: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.get_seq_length()
        needed = used + key_states.shape[-2]
        if (
            self._keys_BHTD is None
            or self._values_BHTD is None
            or needed > self._keys_BHTD.shape[-2]
        ):
            self._reserve(key_states, value_states, used, max(2 * needed, _MIN_CAPACITY))
        assert self._keys_BHTD is not None and self._values_BHTD is not None
        self._keys_BHTD[:, :, used:needed] = key_states
        self._values_BHTD[:, :, used:needed] = value_states
        self.keys = self._keys_BHTD[:, :, :needed]
        self.values = self._values_BHTD[:, :, :needed]
        return self.keys, self.values

    def _reserve(
        self, key_states: torch.Tensor, value_states: torch.Tensor, used: int, capacity: int
    ) -> None:
        b, h, _, d = key_states.shape
        keys = key_states.new_empty(b, h, capacity, d)
        values = value_states.new_empty(b, h, capacity, value_states.shape[-1])
        if used:
            old_keys, old_values = self.states()
            keys[:, :, :used] = old_keys
            values[:, :, :used] = old_values
        self._keys_BHTD, self._values_BHTD = keys, values

    def select(self, index_B: torch.Tensor, trim: int) -> None:
        """Keep rows `index_B`, drop the first `trim` positions; spare capacity is kept."""
        used = self.get_seq_length() - trim
        if self._keys_BHTD is None or self._values_BHTD is None:
            keys, values = self.states()
            self.set_states(keys[index_B, :, trim:], values[index_B, :, trim:])
            return
        # Copy only the used positions into buffers with the same spare room after them.
        spare = self._keys_BHTD.shape[-2] - trim - used
        for name in ("_keys_BHTD", "_values_BHTD"):
            old_BHTD: torch.Tensor = getattr(self, name)
            b, h, d = len(index_B), old_BHTD.shape[1], old_BHTD.shape[-1]
            new_BHTD = old_BHTD.new_empty(b, h, used + spare, d)
            torch.index_select(
                old_BHTD[:, :, trim : trim + used], 0, index_B, out=new_BHTD[:, :, :used]
            )
            setattr(self, name, new_BHTD)
        self.keys = self._keys_BHTD[:, :, :used]
        self.values = self._values_BHTD[:, :, :used]

    def append_rows(self, other: GrowingLayer, width: int) -> None:
        """Append `other`'s rows; both are left-padded to `width` positions (with zeros), in
        buffers with spare room, so the next update writes in place."""
        (old_k, old_v), (new_k, new_v) = self.states(), other.states()
        capacity = max(2 * width, _MIN_CAPACITY)
        rows = len(old_k)
        for name, old_BHTD, new_BHTD in (
            ("_keys_BHTD", old_k, new_k),
            ("_values_BHTD", old_v, new_v),
        ):
            shape = (rows + len(new_BHTD), old_BHTD.shape[1], capacity, old_BHTD.shape[-1])
            merged_BHTD = old_BHTD.new_empty(shape)
            _place_right(merged_BHTD[:rows], old_BHTD, width)
            _place_right(merged_BHTD[rows:], new_BHTD, width)
            setattr(self, name, merged_BHTD)
        assert self._keys_BHTD is not None and self._values_BHTD is not None
        self.keys = self._keys_BHTD[:, :, :width]
        self.values = self._values_BHTD[:, :, :width]

    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached (keys, values) of the used positions."""
        assert self.keys is not None and self.values is not None, "empty cache layer"
        return self.keys, self.values

    def set_states(self, keys_BHTD: torch.Tensor, values_BHTD: torch.Tensor) -> None:
        """Replace the cached states (the next update re-reserves spare room)."""
        self.dtype, self.device = keys_BHTD.dtype, keys_BHTD.device
        self.keys, self.values = keys_BHTD, values_BHTD
        self._keys_BHTD = self._values_BHTD = None
        self.is_initialized = True


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


def _place_right(into_BHCD: torch.Tensor, x_BHTD: torch.Tensor, width: int) -> None:
    """Write `x` at positions [width - T, width) of `into`, zeros before it (padding must hold
    finite values: attention weighs it by exactly 0)."""
    pad = width - x_BHTD.shape[-2]
    into_BHCD[:, :, :pad].zero_()
    into_BHCD[:, :, pad:width].copy_(x_BHTD)


def merge_rows(cache: DynamicCache, fresh: DynamicCache, width: int) -> None:
    """Append `fresh`'s rows to `cache`, both left-padded to `width` positions."""
    for old, new in zip(_layers(cache), _layers(fresh), strict=True):
        old.append_rows(new, width)


def select_rows(cache: DynamicCache, index_B: torch.Tensor, trim: int) -> None:
    """Keep rows `index_B` and drop the first `trim` positions (padding in every kept row)."""
    for layer in _layers(cache):
        layer.select(index_B, trim)


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
