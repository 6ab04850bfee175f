"""GrowingLayer and the batch cache helpers: rows kept, padding trimmed, spare room reused."""

from __future__ import annotations

import torch

from ludic.inference.kv_cache import GrowingLayer, merge_rows, new_cache, select_rows
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


def test_merge_then_select_rows_over_a_model_cache() -> None:
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
    for layer in cache.layers:
        assert torch.equal(layer.keys[:2, :, :2], torch.zeros(2, 2, 2, 8))  # finite padding
        pointer = layer.keys.data_ptr()
        step = torch.randn(3, 2, 1, 8)
        layer.update(step, step)  # lands in the merged buffer's spare room
        assert layer.keys.data_ptr() == pointer and torch.equal(layer.keys[:, :, -1:], step)
        layer.keys, layer.values = layer.keys[:, :, :5], layer.values[:, :, :5]  # undo it
    select_rows(cache, torch.tensor([2, 0]), trim=2)
    for layer, keys, more in zip(cache.layers, old_layers, new_layers, strict=True):
        assert torch.equal(layer.keys[0], more[0, :, 2:])
        assert torch.equal(layer.keys[1], keys[0])  # its 2 columns of left padding are gone
