"""Token logprobs / entropies: alignment with LossInputs, chunking, and packing == padding."""

from __future__ import annotations

import pytest
import torch
from training_fakes import mixed_items, tiny_llama

from ludic.training import collate, sequence_logprobs, token_logprobs


def _reference(logits_BTV: torch.Tensor, ids_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp_BTV = torch.log_softmax(logits_BTV.double(), dim=-1)
    lp = torch.zeros(ids_BT.shape, dtype=torch.double)
    lp[:, 1:] = logp_BTV[:, :-1].gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
    h = torch.zeros(ids_BT.shape, dtype=torch.double)
    h[:, 1:] = -(logp_BTV.exp() * logp_BTV).sum(-1)[:, :-1]
    return lp, h


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_token_logprobs_align_with_next_token(chunk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits_BTV = torch.randn(2, 5, 7, generator=gen)
    ids_BT = torch.randint(0, 7, (2, 5), generator=gen)
    lp, h = token_logprobs(logits_BTV, ids_BT, with_entropy=True, chunk_tokens=chunk)
    ref_lp, ref_h = _reference(logits_BTV, ids_BT)
    assert h is not None
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(h.double(), ref_h, atol=1e-6, rtol=0)
    assert torch.all(lp[:, 0] == 0) and torch.all(h[:, 0] == 0)


def test_token_logprobs_hand_value() -> None:
    # Uniform logits over 4 tokens: every next-token logprob is log(1/4), entropy log 4.
    lp, h = token_logprobs(torch.zeros(1, 3, 4), torch.tensor([[1, 2, 3]]), with_entropy=True)
    assert lp.tolist()[0] == pytest.approx([0.0, -1.3862944, -1.3862944])
    assert h is not None and h.tolist()[0] == pytest.approx([0.0, 1.3862944, 1.3862944])


def test_token_logprobs_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs(torch.zeros(1, 3, 4), torch.zeros(1, 4, dtype=torch.long))


def test_sequence_logprobs_match_unbatched_forward() -> None:
    model = tiny_llama().eval()
    items = mixed_items(4)
    batch = collate(items)
    with torch.no_grad():
        lp_BT, _ = sequence_logprobs(model, batch)
        for b, it in enumerate(items):
            ids_1T = torch.tensor([it.input_ids])
            ref, _ = _reference(model(input_ids=ids_1T).logits, ids_1T)
            n = it.num_tokens
            torch.testing.assert_close(lp_BT[b, :n].double(), ref[0], atol=1e-5, rtol=0)
            assert torch.all(lp_BT[b, n:] == 0)  # padding


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded(attn: str) -> None:
    model = tiny_llama()
    model.config._attn_implementation = attn
    batch = collate(mixed_items(5, seed=3))
    padded, h_pad = sequence_logprobs(model, batch, with_entropy=True)
    packed, h_pack = sequence_logprobs(model, batch, packed=True, with_entropy=True)
    assert h_pad is not None and h_pack is not None
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(h_pack, h_pad, atol=1e-5, rtol=0)
    # Gradients through the packed layout equal those through the padded one.
    weights_BT = torch.randn(padded.shape, generator=torch.Generator().manual_seed(1))
    g_pad = torch.autograd.grad((padded * weights_BT).sum(), list(model.parameters()))
    g_pack = torch.autograd.grad((packed * weights_BT).sum(), list(model.parameters()))
    for a, b in zip(g_pad, g_pack, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recomputed_chunks_give_exact_gradients(dtype: torch.dtype) -> None:
    # Entropy or low-precision logits take the checkpointed (recompute-in-backward) path.
    gen = torch.Generator().manual_seed(2)
    base = torch.randn(2, 6, 11, generator=gen).to(dtype)
    ids_BT = torch.randint(0, 11, (2, 6), generator=gen)
    w_lp, w_h = torch.randn(2, 6, generator=gen), torch.randn(2, 6, generator=gen)

    logits = base.clone().requires_grad_(True)
    lp, h = token_logprobs(logits, ids_BT, with_entropy=True, chunk_tokens=2)
    assert h is not None
    ((lp * w_lp).sum() + (h * w_h).sum()).backward()

    ref_logits = base.double().requires_grad_(True)
    ref_lp, ref_h = _reference(ref_logits, ids_BT)
    ((ref_lp * w_lp.double()).sum() + (ref_h * w_h.double()).sum()).backward()
    assert logits.grad is not None and ref_logits.grad is not None
    torch.testing.assert_close(
        logits.grad.double(),
        ref_logits.grad,
        atol=1e-2 if dtype == torch.bfloat16 else 1e-5,
        rtol=0,
    )
