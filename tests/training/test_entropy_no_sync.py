"""Token entropies ask the device nothing: `_entropy` used to test `bool(off.any())` for -inf
logits on every chunk (a host sync per chunk on a GPU, forward and recompute). Here any
reading of a tensor's value on the host fails while a chunk's terms and their gradient are
computed, and the entropies still come out right, -inf logits (off top-k / top-p, or from the
model) included."""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training.logprobs import _chunk_terms


def _read(self: torch.Tensor, *args: object) -> object:
    raise AssertionError("a tensor's value was read on the host (a device sync)")


def test_entropy_chunks_read_no_value_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # row 0: uniform over 4 logits, H = log 4; row 1: two of four logits at -inf, the other
    # two equal, H = log 2 (the -inf ones add 0, not 0 * -inf = nan)
    inf = float("-inf")
    logits_CV = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, inf, 1.0, inf]], requires_grad=True)
    with monkeypatch.context() as guard:
        for name in ("__bool__", "item", "tolist"):
            guard.setattr(torch.Tensor, name, _read)
        logprob_C, entropy_C = _chunk_terms(logits_CV, torch.tensor([1, 2]), True)
        entropy_C.sum().backward()
    torch.testing.assert_close(
        entropy_C.detach(), torch.tensor([math.log(4), math.log(2)]), atol=1e-7, rtol=0
    )
    torch.testing.assert_close(
        logprob_C.detach(), torch.tensor([-math.log(4), -math.log(2)]), atol=1e-7, rtol=0
    )
    assert logits_CV.grad is not None and bool(torch.isfinite(logits_CV.grad).all())
