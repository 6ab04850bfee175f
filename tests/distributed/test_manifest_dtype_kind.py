"""`check_against` refuses a manifest entry whose dtype kind differs from the served tensor's
(a float entry for an int buffer, an int entry for a float weight), naming the tensor and both
dtypes, and keeps float-to-float differences (a bf16 wire for fp32 weights)."""

from __future__ import annotations

import pytest
import torch

from ludic.distributed.manifest import ManifestError, check_against, plan_manifest

SERVED = {
    "layer.weight": torch.zeros(4, 4),
    "layer.steps": torch.zeros(3, dtype=torch.int64),
    "layer.mask": torch.zeros(2, dtype=torch.bool),
}
SHAPES = {name: tuple(t.shape) for name, t in SERVED.items()}
DTYPES = {name: t.dtype for name, t in SERVED.items()}


def test_a_float_entry_for_an_int_buffer_is_refused_naming_both_dtypes() -> None:
    manifest = plan_manifest(
        {**SERVED, "layer.steps": SERVED["layer.steps"].float()}, version=1, bucket_bytes=1 << 20
    )
    check_against(manifest, SHAPES)  # shapes alone match: the kind is what is wrong
    with pytest.raises(ManifestError, match=r"layer\.steps: sent float32, served int64"):
        check_against(manifest, SHAPES, DTYPES)


def test_an_int_entry_for_a_float_weight_is_refused() -> None:
    manifest = plan_manifest(
        {**SERVED, "layer.weight": SERVED["layer.weight"].long()}, version=1, bucket_bytes=1 << 20
    )
    with pytest.raises(ManifestError, match=r"layer\.weight: sent int64, served float32") as e:
        check_against(manifest, SHAPES, DTYPES)
    assert "within its kind" in str(e.value)


def test_float_widths_and_integer_widths_are_kept() -> None:
    manifest = plan_manifest(
        {
            "layer.weight": SERVED["layer.weight"].to(torch.bfloat16),  # bf16 wire, fp32 served
            "layer.steps": SERVED["layer.steps"].to(torch.int32),
            "layer.mask": SERVED["layer.mask"].to(torch.uint8),
        },
        version=1,
        bucket_bytes=1 << 20,
    )
    check_against(manifest, SHAPES, DTYPES)


def test_tensors_the_dtypes_do_not_name_are_checked_by_shape_only() -> None:
    manifest = plan_manifest(
        {**SERVED, "layer.steps": SERVED["layer.steps"].float()}, version=1, bucket_bytes=1 << 20
    )
    check_against(manifest, SHAPES, {"layer.weight": torch.float32})
