"""GrowingLayer and the batch cache helpers: rows kept, padding trimmed, spare room reused."""

from __future__ import annotations

import warnings

import torch

from ludic.inference.embedded.kv_cache import (
    GrowingLayer,
    cache_kwarg,
    compact_rows,
    compaction_order,
    merge_rows,
    new_cache,
    pad_left,
)
from ludic.models import TinyModelSpec, build_tiny_model


def filled(rows: int, positions: int, steps: int) -> tuple[GrowingLayer, torch.Tensor]:
    """A layer fed a prefill of `positions` then `steps` one-position updates; its expected keys
    (values are keys + 1)."""
    layer = GrowingLayer()
    keys = torch.randn(rows, 2, positions, 4)
    layer.update(keys, keys + 1)
    for _ in range(steps):
        step = torch.randn(rows, 2, 1, 4)
        layer.update(step, step + 1)
        keys = torch.cat([keys, step], dim=-2)
    return layer, keys


def test_updates_write_in_place_within_the_spare_room() -> None:
    layer, expected = filled(rows=3, positions=5, steps=1)
    pointer = layer.keys.data_ptr()
    step = torch.randn(3, 2, 1, 4)
    layer.update(step, step + 1)
    assert layer.keys.data_ptr() == pointer  # no re-allocation
    assert torch.equal(layer.keys, torch.cat([expected, step], dim=-2))


def test_select_keeps_rows_drops_padding_and_keeps_growing() -> None:
    layer, expected = filled(rows=5, positions=20, steps=3)
    index = torch.tensor([4, 0, 2])
    layer.select(index, trim=6)
    assert torch.equal(layer.keys, expected[index, :, 6:])
    assert torch.equal(layer.values, expected[index, :, 6:] + 1)
    pointer = layer.keys.data_ptr()
    step = torch.randn(3, 2, 1, 4)
    layer.update(step, step + 1)  # the spare room survived the selection
    assert layer.keys.data_ptr() == pointer
    assert torch.equal(layer.keys, torch.cat([expected[index, :, 6:], step], dim=-2))
    assert torch.equal(layer.values[:, :, -1:], step + 1)


def test_select_then_growing_past_the_capacity_keeps_everything() -> None:
    layer, expected = filled(rows=4, positions=30, steps=0)
    layer.select(torch.tensor([1, 3]), trim=0)
    kept = expected[[1, 3]]
    for _ in range(100):  # well past the reserved capacity
        step = torch.randn(2, 2, 1, 4)
        layer.update(step, step + 1)
        kept = torch.cat([kept, step], dim=-2)
    assert torch.equal(layer.keys, kept) and torch.equal(layer.values, kept + 1)


def test_merge_then_compact_rows_over_a_model_cache() -> None:
    model, _ = build_tiny_model(seed=0, spec=TinyModelSpec(num_hidden_layers=2))
    cache, fresh = new_cache(model.config), new_cache(model.config)
    old_layers, new_layers = [], []
    for layer, other in zip(cache.layers, fresh.layers, strict=True):
        keys = torch.randn(2, 2, 3, 8)
        layer.update(keys, keys)
        more = torch.randn(1, 2, 5, 8)
        other.update(more, more)
        old_layers.append(keys)
        new_layers.append(more)
    merge_rows(cache, fresh, width=5)
    steps = []
    for layer in cache.layers:
        assert torch.equal(layer.keys[:2, :, :2], torch.zeros(2, 2, 2, 8))  # finite padding
        pointer = layer.keys.data_ptr()
        step = torch.randn(3, 2, 1, 8)
        layer.update(step, step)  # lands in the merged buffer's spare room
        assert layer.keys.data_ptr() == pointer and torch.equal(layer.keys[:, :, -1:], step)
        steps.append(step)
    compact_rows(cache, [2, 0], trim=2)
    for layer, keys, more, step in zip(cache.layers, old_layers, new_layers, steps, strict=True):
        assert torch.equal(layer.keys[0], torch.cat([more[0, :, 2:], step[2]], dim=-2))
        assert torch.equal(layer.keys[1], torch.cat([keys[0], step[0]], dim=-2))


def test_the_model_takes_our_cache_under_the_keyword_we_pass_without_a_deprecation() -> None:
    model, _ = build_tiny_model(seed=0, spec=TinyModelSpec(num_hidden_layers=2))
    cache = new_cache(model.config)
    ids_BS = torch.tensor([[5, 6, 7]])
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("error")  # transformers warns when a renamed keyword is used
        model(input_ids=ids_BS, use_cache=True, **{cache_kwarg(model): cache})
    assert cache.layers[0].keys.shape[-2] == 3  # the model wrote into our cache


def test_compaction_moves_only_rows_that_fill_freed_slots() -> None:
    assert compaction_order([0, 1, 2, 3]) == [0, 1, 2, 3]
    assert compaction_order([0, 2, 3, 5, 6]) == [0, 6, 2, 3, 5]  # 1 and 4 freed: 6 fills 1
    assert compaction_order([4, 5]) == [5, 4]
    layer, expected = filled(rows=6, positions=10, steps=2)
    buffer_pointer = layer._buffers_or_fail()[0].data_ptr()
    order = compaction_order([0, 2, 3, 5])
    layer.compact(order, trim=3)
    assert layer._buffers_or_fail()[0].data_ptr() == buffer_pointer  # in place
    assert torch.equal(layer.keys, expected[order, :, 3:])
    assert torch.equal(layer.values, expected[order, :, 3:] + 1)
    step = torch.randn(4, 2, 1, 4)
    layer.update(step, step + 1)
    assert torch.equal(layer.keys, torch.cat([expected[order, :, 3:], step], dim=-2))


def test_merging_rows_writes_in_place_while_the_buffers_have_room() -> None:
    layer, expected = filled(rows=2, positions=40, steps=0)
    values = expected + 1
    pointers = []
    # The first merge re-allocates with spare rows; narrower rows, then rows wider by less than
    # the spare room on the left, land in place.
    for positions in (30, 20, 44):
        other, more = filled(rows=1, positions=positions, steps=0)
        width = max(layer.keys.shape[-2], positions)
        layer.append_rows(other, width)
        expected = torch.cat([pad_left(expected, width, -2), pad_left(more, width, -2)])
        values = torch.cat([pad_left(values, width, -2), pad_left(more + 1, width, -2)])
        assert torch.equal(layer.keys, expected) and torch.equal(layer.values, values)
        pointers.append(layer._buffers_or_fail()[0].data_ptr())
    assert pointers[0] == pointers[1] == pointers[2]
    # Rows much wider than the spare room on the left: new buffers, same contents.
    other, more = filled(rows=1, positions=200, steps=0)
    layer.append_rows(other, 200)
    assert layer._buffers_or_fail()[0].data_ptr() != pointers[0]
    assert torch.equal(layer.keys[:5, :, 200 - 44 :], expected)
    assert torch.equal(layer.keys[:5, :, : 200 - 44], torch.zeros(5, 2, 156, 4))
    assert torch.equal(layer.keys[5], more[0])


def test_select_repeats_rows_for_a_deduplicated_prefill() -> None:
    layer, expected = filled(rows=2, positions=7, steps=0)
    select_rows_index = torch.tensor([0, 0, 1, 0])
    layer.select(select_rows_index, trim=0)
    assert torch.equal(layer.keys, expected[select_rows_index])
