"""On a GPU, a chunk's sampling transform (temperature, top-k / top-p) and its logprobs,
entropies and gradients run without one device sync: CUDA's own sync detector
(`torch.cuda.set_sync_debug_mode("error")`) raises on any. The CPU test of the same
(`test_sampling_transform_no_sync.py`) can only see host reads made from Python; this one
also sees those made inside torch (a sized `nonzero`, a host-to-device copy)."""

from __future__ import annotations

import pytest
import torch

from ludic.inference.embedded.token_sampling import RowKnobs
from ludic.training.logprobs import _chunk_terms

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

V = 1000
# (temperature, top_k, top_p) per row: identity, temperature alone, top-k, top-p, greedy
ROWS = [(1.0, -1, 1.0), (0.7, -1, 1.0), (0.5, 20, 1.0), (1.3, -1, 0.6), (0.0, 30, 0.9)]


def test_a_chunk_under_the_sampling_transform_syncs_nothing_on_the_gpu() -> None:
    gen = torch.Generator().manual_seed(0)
    logits_CV = (3.0 * torch.randn(len(ROWS), V, generator=gen)).cuda().requires_grad_(True)
    targets_C = logits_CV.detach().argmax(dim=-1)
    knobs = [
        torch.tensor([t for t, _, _ in ROWS]).cuda(),
        torch.tensor([k for _, k, _ in ROWS]).cuda(),
        torch.tensor([p for _, _, p in ROWS]).cuda(),
    ]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logprob_C, entropy_C = _chunk_terms(logits_CV, targets_C, True, *knobs, 3)
        (logprob_C.sum() + entropy_C.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for row, (temperature, top_k, top_p) in enumerate(ROWS):
        knob = RowKnobs.of([temperature], [top_k], [top_p], V, device="cuda")
        expected = knob.logprobs(logits_CV[row : row + 1].detach())[0, targets_C[row]]
        torch.testing.assert_close(logprob_C[row].detach(), expected, atol=1e-5, rtol=0)
    assert logits_CV.grad is not None and bool(torch.isfinite(logits_CV.grad).all())
