"""The sampling transform on training logits (temperature, top-k / top-p) asks the device
nothing per chunk: `processed_logits` used to test `bool(any temperature != 1)` and
`bool(any filter on)` and read the filtered rows' knobs with `.tolist()` on every chunk (host
syncs per chunk on a GPU, forward and recompute). The rows to sort are now counted once per
call, and a chunk's computation reads no tensor value on the host; its values stay the
engine's own, bit for bit."""

from __future__ import annotations

import pytest
import torch

from ludic.inference.embedded.token_sampling import RowKnobs
from ludic.training import token_logprobs
from ludic.training.collate import TokenSampling
from ludic.training.logprobs import _chunk_terms

V = 12
# (temperature, top_k, top_p) per row: identity, temperature alone, top-k, top-p, greedy,
# a top-k of the whole vocabulary (off)
ROWS = [(1.0, -1, 1.0), (0.7, -1, 1.0), (0.5, 2, 1.0), (1.3, -1, 0.6), (0.0, 3, 1.0), (1.0, V, 1.0)]
FILTERED = 3  # rows 2, 3 and 4


def _read(self: torch.Tensor, *args: object, **kwargs: object) -> object:
    raise AssertionError("a tensor's value was read on the host (a device sync)")


def _knobs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.tensor([t for t, _, _ in ROWS]),
        torch.tensor([k for _, k, _ in ROWS]),
        torch.tensor([p for _, _, p in ROWS]),
    )


def test_a_chunk_under_the_sampling_transform_reads_no_value_on_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = torch.Generator().manual_seed(0)
    logits_CV = (3.0 * torch.randn(len(ROWS), V, generator=gen)).requires_grad_(True)
    targets_C = logits_CV.detach().argmax(dim=-1)  # on every row's support
    with monkeypatch.context() as guard:
        for name in ("__bool__", "item", "tolist", "nonzero"):  # nonzero: a sized output
            guard.setattr(torch.Tensor, name, _read)
        guard.setattr(torch, "nonzero", _read)
        logprob_C, entropy_C = _chunk_terms(logits_CV, targets_C, True, *_knobs(), FILTERED)
        (logprob_C.sum() + entropy_C.sum()).backward()
    for row, (temperature, top_k, top_p) in enumerate(ROWS):
        engine = RowKnobs.of([temperature], [top_k], [top_p], V).logprobs(logits_CV[row : row + 1])
        expected = engine[0, targets_C[row]].detach()
        assert torch.equal(logprob_C[row].detach(), expected), (row, logprob_C[row], expected)
    # temperature 1 is divided by too: x / 1 is x, so the identity row is the plain log-softmax
    plain = torch.log_softmax(logits_CV[0].detach(), dim=-1)[targets_C[0]]
    assert torch.equal(logprob_C[0].detach(), plain)
    assert logits_CV.grad is not None and bool(torch.isfinite(logits_CV.grad).all())


def test_the_rows_to_sort_are_counted_once_per_call_and_only_they_are_sorted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 12 positions in chunks of 4, recomputed in backward: tokens 3 and 10 were drawn with
    # top-k, so the logits of positions 2 and 9 (which predict them) are filtered
    temperature_1T = torch.full((1, 12), 0.8)
    top_k_1T = torch.full((1, 12), -1)
    top_k_1T[0, 3] = top_k_1T[0, 10] = 4
    sampling = TokenSampling(
        temperature_BT=temperature_1T, top_k_BT=top_k_1T, top_p_BT=torch.ones(1, 12)
    )
    logits_1TV = torch.randn(1, 12, V, requires_grad=True)
    ids_1T = torch.randint(0, V, (1, 12))
    reads: list[str] = []
    sorted_rows: list[int] = []
    tolist, sort = torch.Tensor.tolist, torch.Tensor.sort

    def counted_tolist(self: torch.Tensor) -> object:
        reads.append("tolist")
        return tolist(self)

    def counted_sort(self: torch.Tensor, *args: object, **kwargs: object) -> object:
        sorted_rows.append(self.shape[0])
        return sort(self, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as guard:
        guard.setattr(torch.Tensor, "tolist", counted_tolist)
        guard.setattr(torch.Tensor, "sort", counted_sort)
        for name in ("__bool__", "item"):
            guard.setattr(torch.Tensor, name, _read)
        lp_1T, _ = token_logprobs(logits_1TV, ids_1T, chunk_tokens=4, sampling=sampling)
        lp_1T.sum().backward()
    assert reads == ["tolist"]  # one read for the whole call, not one per chunk
    # chunks 0 and 2 sort their one filtered row, forward and recompute; chunk 1 sorts nothing
    assert sorted_rows == [1, 1, 1, 1]


def test_the_filtered_rows_are_picked_without_nonzero_static(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.nonzero_static has no CUDA kernel before torch 2.6 (Ludic allows torch 2.4): the
    rows are picked by a stable sort instead, giving the same rows in the same order."""
    monkeypatch.setattr(torch, "nonzero_static", _read)
    gen = torch.Generator().manual_seed(1)
    logits_CV = 3.0 * torch.randn(len(ROWS), V, generator=gen)
    targets_C = logits_CV.argmax(dim=-1)
    (logprob_C,) = _chunk_terms(logits_CV, targets_C, False, *_knobs(), FILTERED)
    for row, (temperature, top_k, top_p) in enumerate(ROWS):
        engine = RowKnobs.of([temperature], [top_k], [top_p], V).logprobs(logits_CV[row : row + 1])
        assert torch.equal(logprob_C[row], engine[0, targets_C[row]]), row


def test_a_caller_that_gives_knobs_without_a_count_still_gets_the_filter() -> None:
    """`_chunk_terms` with sampling knobs but no count of filtered rows counts them itself
    (a default of 0 skipped top-k / top-p without a word)."""
    gen = torch.Generator().manual_seed(2)
    logits_CV = 3.0 * torch.randn(len(ROWS), V, generator=gen)
    targets_C = logits_CV.argmax(dim=-1)
    (counted,) = _chunk_terms(logits_CV, targets_C, False, *_knobs(), FILTERED)
    (uncounted,) = _chunk_terms(logits_CV, targets_C, False, *_knobs())
    assert torch.equal(counted, uncounted)
