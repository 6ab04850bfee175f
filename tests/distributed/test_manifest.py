"""Weight manifests: bucket planning, JSON round trip, validation and (un)flattening."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ludic.distributed.manifest import (
    ManifestError,
    WeightManifest,
    check_against,
    flatten_into,
    follows,
    fused_groups,
    plan_manifest,
    unflatten,
)


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(4, 4, generator=g),  # 64 bytes
        "b": torch.randn(8, generator=g),  # 32 bytes
        "half": torch.randn(6, generator=g).to(torch.bfloat16),  # 12 bytes
        "big": torch.randn(40, generator=g),  # 160 bytes: alone
        "c": torch.randn(2, 3, generator=g),  # 24 bytes
        "steps": torch.arange(3),  # int64, 24 bytes
    }


def test_plan_packs_per_dtype_and_sends_big_tensors_alone() -> None:
    manifest = plan_manifest(_state(), version=7, bucket_bytes=100)
    layout = [
        (b.dtype, [e.name for e in entries])
        for b, entries in zip(manifest.buckets, manifest.bucket_entries(), strict=True)
    ]
    # a (64) + b (32) = 96 <= 100; "big" cannot join (96 + 160 > 100) and fills its own
    # bucket; "c" then opens a new float32 bucket. bfloat16 and int64 get their own buckets.
    assert layout == [
        ("float32", ["a", "b"]),
        ("bfloat16", ["half"]),
        ("float32", ["big"]),
        ("float32", ["c"]),
        ("int64", ["steps"]),
    ]
    assert manifest.total_bytes == 64 + 32 + 12 + 160 + 24 + 24
    assert manifest.version == 7 and manifest.full


def test_big_tensors_travel_alone_without_splitting_small_ones() -> None:
    # alone_bytes=30: a (64), b (32), big (160) travel alone; half, c, steps pack as before
    manifest = plan_manifest(_state(), version=0, bucket_bytes=100, alone_bytes=30)
    layout = [[e.name for e in entries] for entries in manifest.bucket_entries()]
    assert layout == [["a"], ["b"], ["half"], ["big"], ["c"], ["steps"]]
    state = {f"small{i}": torch.zeros(2) for i in range(3)}
    state = {"small0": state["small0"], "big": torch.zeros(50), **state}
    manifest = plan_manifest(state, version=0, bucket_bytes=100, alone_bytes=40)
    layout = [[e.name for e in entries] for entries in manifest.bucket_entries()]
    assert layout == [["small0", "small1", "small2"], ["big"]]


def test_json_round_trip_is_exact() -> None:
    manifest = plan_manifest(_state(), version=3, bucket_bytes=100, full=False)
    assert WeightManifest.from_json(manifest.to_json()) == manifest
    unverified = plan_manifest(_state(), version=3, bucket_bytes=100, checksums=False)
    assert WeightManifest.from_json(unverified.to_json()).checksums is False


def test_a_manifest_from_an_older_sender_asks_for_checksums() -> None:
    data = plan_manifest(_state(), version=1, bucket_bytes=100, checksums=False).to_json()
    del data["checksums"]
    assert WeightManifest.from_json(data).checksums is True


def test_pieces_split_only_buckets_larger_than_a_piece_and_survive_json() -> None:
    state = {"big": torch.zeros(10), "half": torch.zeros(6, dtype=torch.bfloat16)}
    manifest = plan_manifest(state, version=0, bucket_bytes=1, piece_bytes=16)
    big, half = manifest.buckets  # 40 bytes of float32; 12 bytes of bfloat16
    assert manifest.pieces(big) == [(0, 4), (4, 8), (8, 10)]
    assert manifest.pieces(half) == [(0, 6)]  # not larger than a piece: whole
    assert WeightManifest.from_json(manifest.to_json()) == manifest
    whole = plan_manifest(state, version=0, bucket_bytes=1)
    assert "piece_bytes" not in whole.to_json() and whole.pieces(whole.buckets[0]) == [(0, 10)]
    with pytest.raises(ValueError, match="piece_bytes must be >= 0"):
        plan_manifest(state, version=0, bucket_bytes=1, piece_bytes=-1)


def test_flatten_then_unflatten_restores_every_tensor() -> None:
    state = _state()
    manifest = plan_manifest(state, version=0, bucket_bytes=100)
    restored: dict[str, torch.Tensor] = {}
    for bucket, entries in zip(manifest.buckets, manifest.bucket_entries(), strict=True):
        flat_N = torch.empty(bucket.numel, dtype=state[entries[0].name].dtype)
        restored.update(unflatten(flatten_into(flat_N, entries, state), entries))
    assert restored.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(restored[name], tensor), name


def _bad(change: dict[str, Any]) -> dict[str, Any]:
    data = plan_manifest(_state(), version=1, bucket_bytes=100).to_json()
    return {**data, **change}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": -1}, "version must be an int >= 0"),
        ({"version": "1"}, "version must be an int >= 0"),
        ({"full": "yes"}, "'full' must be a bool"),
        ({"checksums": 1}, "'checksums' must be a bool"),
        ({"piece_bytes": -8}, "piece_bytes must be an int >= 0"),
        ({"buckets": [["float32", 24], ["complex64", 6]]}, "unsupported dtype"),
        ({"tensors": [["a", "float32", [4, 4], 9, 0]]}, "bucket 9, which does not exist"),
        ({"tensors": [["a", "float32", [4, -4], 0, 0]]}, "dimension of a must be an int >= 0"),
        ({"tensors": [["a", "float32", [4, 4], 0, 0], ["a", "float32", [2], 0, 16]]}, "twice"),
        ({"tensors": [["a", "float32", [4, 4], 0, 3]]}, "does not start where"),
        ({"tensors": [["a", "bfloat16", [4, 4], 0, 0]]}, "its bucket holds float32"),
        ({"buckets": [["float32", 5]], "tensors": [["a", "float32", [4], 0, 0]]}, "holds 5"),
        ({"tensors": "nope"}, "malformed weight manifest"),
    ],
)
def test_from_json_rejects_malformed_manifests(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        WeightManifest.from_json(_bad(change))


def test_check_against_names_what_does_not_match() -> None:
    state = _state()
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    manifest = plan_manifest(state, version=0, bucket_bytes=100)
    check_against(manifest, shapes)  # matches
    with pytest.raises(ManifestError, match=r"does not have, e.g. \[.a.\]"):
        check_against(manifest, {k: v for k, v in shapes.items() if k != "a"})
    with pytest.raises(ManifestError, match="b: sent \\(8,\\), served \\(9,\\)"):
        check_against(manifest, {**shapes, "b": (9,)})
    # both name the usual cause and its fix: a trainer started without the served model
    for served in ({k: v for k, v in shapes.items() if k != "a"}, {**shapes, "b": (9,)}):
        with pytest.raises(
            ManifestError, match=r"`ludic train --model DIR` or `ludic learner --model DIR`"
        ):
            check_against(manifest, served)
    partial = plan_manifest({"a": state["a"]}, version=0, bucket_bytes=100)
    with pytest.raises(ManifestError, match="a full push misses 5 tensors"):
        check_against(partial, shapes)
    check_against(plan_manifest({"a": state["a"]}, version=0, bucket_bytes=100, full=False), shapes)


def test_unsupported_dtype_is_refused_when_planning() -> None:
    with pytest.raises(ManifestError, match="cannot be published"):
        plan_manifest({"z": torch.zeros(2, dtype=torch.complex64)}, version=0, bucket_bytes=10)


def _layout(manifest: WeightManifest) -> list[list[str]]:
    return [[e.name for e in entries] for entries in manifest.bucket_entries()]


def test_tensors_back_to_back_share_buckets_whatever_their_size() -> None:
    flat = torch.arange(100, dtype=torch.float32)
    views = {"a": flat[0:30], "b": flat[30:60], "c": flat[60:62], "d": flat[62:100]}
    assert follows(list(views.values())) == [None, 0, 1, 2]
    # a, b, d are "large" (>= 40 bytes); each follows the last: one span per 256 bytes.
    manifest = plan_manifest(views, version=0, bucket_bytes=256, alone_bytes=40)
    assert _layout(manifest) == [["a", "b", "c"], ["d"]]  # 248 bytes, then d would not fit
    apart = {name: t.clone() for name, t in views.items()}  # separate allocations
    assert follows(list(apart.values())) == [None] * 4
    assert _layout(plan_manifest(apart, version=0, bucket_bytes=256, alone_bytes=40)) == [
        ["a"],
        ["b"],
        ["c"],
        ["d"],
    ]


def test_a_span_bucket_never_takes_a_tensor_from_elsewhere() -> None:
    flat = torch.zeros(64)
    other = torch.zeros(2)  # small, not next to anything: packed with the small ones
    tensors = {
        "a": flat[0:20],
        "small": other,
        "b": flat[20:40],
        "tied": flat[20:40],  # the same memory again: follows nothing
        "half": torch.zeros(20, dtype=torch.bfloat16),
        "c": flat[40:64],
    }
    manifest = plan_manifest(tensors, version=0, bucket_bytes=1024, alone_bytes=40)
    # "half" (another dtype) ends the span: "c" starts a new one.
    assert _layout(manifest) == [["a", "b"], ["small"], ["tied"], ["half"], ["c"]]
    for entries in manifest.bucket_entries():  # every bucket with a large tensor is one span
        if any(e.numel * 4 >= 40 for e in entries):
            first, last = tensors[entries[0].name], tensors[entries[-1].name]
            assert last.data_ptr() + last.numel() * 4 - first.data_ptr() == sum(
                e.numel * 4 for e in entries
            )


def _qwen2_layer(bias: bool = True) -> dict[str, torch.Tensor]:
    """One decoder layer's tensors in state-dict order (separate allocations)."""
    names = ["q_proj", "k_proj", "v_proj"]
    layer: dict[str, torch.Tensor] = {}
    for name, rows in zip(names, (8, 4, 4), strict=True):
        layer[f"l.self_attn.{name}.weight"] = torch.zeros(rows, 8)
        if bias:
            layer[f"l.self_attn.{name}.bias"] = torch.zeros(rows)
    layer["l.self_attn.o_proj.weight"] = torch.zeros(8, 8)
    layer["l.mlp.gate_proj.weight"] = torch.zeros(12, 8)
    layer["l.mlp.up_proj.weight"] = torch.zeros(12, 8)
    layer["l.mlp.down_proj.weight"] = torch.zeros(8, 12)
    return layer


def test_fused_groups_are_found_by_name_with_any_prefix() -> None:
    names = list(_qwen2_layer())
    q, k, v = (f"l.self_attn.{p}_proj" for p in "qkv")
    assert fused_groups(names) == [
        [f"{q}.weight", f"{k}.weight", f"{v}.weight"],
        [f"{q}.bias", f"{k}.bias", f"{v}.bias"],
        ["l.mlp.gate_proj.weight", "l.mlp.up_proj.weight"],
    ]
    assert fused_groups([n for n in names if n != f"{k}.bias"])[1] == [
        "l.mlp.gate_proj.weight",
        "l.mlp.up_proj.weight",
    ]  # biases only as a full set


def test_fused_groups_travel_together_in_order_with_biases_apart() -> None:
    """Small separate tensors: q/k/v weights consecutive, then their biases, never split by a
    bucket boundary (old planner: q.w, q.b, k.w, ... and a boundary inside)."""
    layer = _qwen2_layer()
    manifest = plan_manifest(layer, version=0, bucket_bytes=600, alone_bytes=10_000)
    layout = _layout(manifest)
    for group in fused_groups(list(layer)):
        bucket = next(names for names in layout if group[0] in names)
        start = bucket.index(group[0])
        assert bucket[start : start + len(group)] == group, layout
    assert len(layout) > 1  # 600-byte buckets: boundaries fall inside the layer


def test_a_bucket_boundary_never_falls_inside_a_flat_fused_group() -> None:
    layer = _qwen2_layer(bias=False)
    flat = torch.zeros(sum(t.numel() for t in layer.values()))
    views, offset = {}, 0
    for name, t in layer.items():
        views[name] = flat[offset : offset + t.numel()].view_as(t)
        offset += t.numel()
    # q (256 B) + k (128 B) fit a 400 B bucket, v would not: the whole group moves on.
    layout = _layout(plan_manifest(views, version=0, bucket_bytes=400, alone_bytes=100))
    assert [
        "l.self_attn.q_proj.weight",
        "l.self_attn.k_proj.weight",
        "l.self_attn.v_proj.weight",
    ] in [names[:3] for names in layout]
    assert ["l.mlp.gate_proj.weight", "l.mlp.up_proj.weight"] in [names[:2] for names in layout]
    # Without the groups the span is cut after k.
    cut = _layout(plan_manifest(views, version=0, bucket_bytes=400, alone_bytes=100, together=()))
    assert ["l.self_attn.q_proj.weight", "l.self_attn.k_proj.weight"] in cut


def test_large_separate_fused_tensors_still_travel_alone_and_mixed_ones_together() -> None:
    layer = _qwen2_layer(bias=False)
    alone = _layout(plan_manifest(layer, version=0, bucket_bytes=10_000, alone_bytes=100))
    assert ["l.self_attn.q_proj.weight"] in alone and ["l.self_attn.k_proj.weight"] in alone
    # q large, k and v small: all three in one bucket (a server would move k and v otherwise).
    mixed = _layout(plan_manifest(layer, version=0, bucket_bytes=10_000, alone_bytes=200))
    qkv = ["l.self_attn.q_proj.weight", "l.self_attn.k_proj.weight", "l.self_attn.v_proj.weight"]
    assert qkv in mixed
