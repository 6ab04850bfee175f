"""Batch-invariant GEMMs and attention on a GPU (CI has no GPU and skips this; the user path,
`ludic train --device cuda --batch-invariant`, is in tests/recipes/test_train_cuda.py).

Measured on an H100 (torch 2.11.0+cu130, 2026-11-27): cuBLAS gave a row other bits in a GEMM
of 17 rows than of 16, and a batched GEMM of 16-row slices did too, so `linear` runs every GEMM
on exactly 16 rows there, chunk after chunk."""

from __future__ import annotations

import pytest
import torch

from ludic.inference.embedded import batch_invariant as invariant
from ludic.inference.embedded.lean_forward import LeanForward
from ludic.models import build_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_row_of_a_gpu_gemm_has_the_same_bits_at_any_row_count() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(512, 256, generator=generator).cuda()
    x = torch.randn(4096, 256, generator=generator).cuda()
    alone = torch.cat([invariant.linear(x[i : i + 1], weight, None) for i in range(8)])
    for rows in (16, 17, 35, 200, 1000, 4096):
        assert torch.equal(invariant.linear(x[:rows], weight, None)[:8], alone), rows


def test_the_start_up_checks_pass_on_the_gpu() -> None:
    """Both checks run on CUDA tensors (the attention check built a CPU index there before)."""
    model, _ = build_tiny_model(seed=0)
    lean = LeanForward.build(model.cuda(), batch_invariant=True)
    assert isinstance(lean, LeanForward), lean
