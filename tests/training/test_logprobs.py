"""Token logprobs / entropies: alignment with LossInputs, chunking, and packing == padding."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from training_fakes import mixed_items, tiny_llama

from ludic.inference.embedded.token_sampling import RowKnobs
from ludic.rollouts.samples import SAWItem
from ludic.training import collate, sequence_logprobs, token_logprobs
from ludic.training.collate import TokenSampling


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


# -- logprobs under the sampling transform (behaviour logprobs' definition) -------------------

V = 50


def _knobs(temperature: float, top_k: int, top_p: float) -> RowKnobs:
    return RowKnobs.of([temperature], [top_k], [top_p], V)


def _sampled_sequence(
    logits_TV: torch.Tensor, knobs: list[tuple[float, int, float]], gen: torch.Generator
) -> torch.Tensor:
    """Token t + 1 drawn from the engine's processed distribution at position t."""
    ids = [int(torch.randint(0, V, (1,), generator=gen))]
    for t, (temperature, k, p) in enumerate(knobs):
        lp_V = _knobs(temperature, k, p).logprobs(logits_TV[t : t + 1])[0]
        support = torch.nonzero(lp_V > float("-inf")).squeeze(-1)
        ids.append(int(support[torch.randint(0, len(support), (1,), generator=gen)]))
    return torch.tensor([ids])


KNOBS = [
    (0.7, -1, 0.9),
    (0.0, 5, 1.0),
    (1.3, 10, 0.5),
    (1.0, -1, 1.0),
    (0.5, 3, 0.8),
    (0.0, -1, 1.0),
]


@pytest.mark.parametrize("chunk", [1, 4, 1024])
def test_logprobs_under_sampling_equal_the_engines_processed_logprobs(chunk: int) -> None:
    # Greedy (temperature 0) rows count as temperature 1 with the same support, as in the engine.
    gen = torch.Generator().manual_seed(0)
    logits_1TV = 3.0 * torch.randn(1, len(KNOBS) + 1, V, generator=gen)
    ids_1T = _sampled_sequence(logits_1TV[0], KNOBS, gen)
    temps = [1.0] + [t or 1.0 for t, _, _ in KNOBS]
    sampling = TokenSampling(
        temperature_BT=torch.tensor([temps]),
        top_k_BT=torch.tensor([[-1] + [k for _, k, _ in KNOBS]]),
        top_p_BT=torch.tensor([[1.0] + [p for _, _, p in KNOBS]]),
    )
    lp_1T, _ = token_logprobs(logits_1TV, ids_1T, chunk_tokens=chunk, sampling=sampling)
    expected = [0.0] + [
        float(_knobs(*knob).logprobs(logits_1TV[0, t : t + 1])[0, ids_1T[0, t + 1]])
        for t, knob in enumerate(KNOBS)
    ]
    # the same division, support and log-softmax as the engine: equal logits, equal bits
    assert torch.equal(lp_1T[0], torch.tensor(expected)), lp_1T[0] - torch.tensor(expected)
    plain, _ = token_logprobs(logits_1TV, ids_1T)
    assert (lp_1T - plain).abs().max() > 0.1  # the transform matters on these tokens


def _one_position(
    logits_V: list[float], target: int, temperature: float, top_k: int, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_11V = torch.tensor([[logits_V, [0.0] * len(logits_V)]], requires_grad=True)
    sampling = TokenSampling(
        temperature_BT=torch.tensor([[1.0, temperature]]),
        top_k_BT=torch.tensor([[-1, top_k]]),
        top_p_BT=torch.tensor([[1.0, top_p]]),
    )
    lp, _ = token_logprobs(logits_11V, torch.tensor([[0, target]]), sampling=sampling)
    lp[0, 1].backward()
    assert logits_11V.grad is not None
    return lp[0, 1].detach(), logits_11V.grad[0, 0]


def test_gradient_flows_through_the_renormalised_log_softmax_on_the_support() -> None:
    # logits [3, 2, 1, 0], T = 0.5, top_k = 2: support {0, 1}, x = logits / T = [6, 4, ...]
    #   log p(1) = 4 - log(e^6 + e^4);  d/d logits = (onehot(1) - p_support) / T, 0 elsewhere
    value, grad = _one_position([3.0, 2.0, 1.0, 0.0], target=1, temperature=0.5, top_k=2)
    assert float(value) == pytest.approx(4 - math.log(math.exp(6) + math.exp(4)), abs=1e-6)
    p0, p1 = math.exp(6) / (math.exp(6) + math.exp(4)), math.exp(4) / (math.exp(6) + math.exp(4))
    assert grad.tolist() == pytest.approx([-p0 / 0.5, (1 - p1) / 0.5, 0.0, 0.0], abs=1e-6)


def test_top_p_support_follows_the_engines_rule() -> None:
    # logits log([0.5, 0.3, 0.2]), top_p = 0.6: mass before token 1 is 0.5 < 0.6 (kept), before
    # token 2 is 0.8 >= 0.6 (dropped): p(1) = 0.3 / 0.8
    logits = [math.log(0.5), math.log(0.3), math.log(0.2)]
    value, _ = _one_position(logits, target=1, temperature=1.0, top_k=-1, top_p=0.6)
    assert float(value) == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)


def test_a_sampled_token_off_the_trainers_support_stays_in_it() -> None:
    # logits [3, 2, 1, 0], top_k = 1 keeps token 0 only; target 2 (the engine's logits put it
    # in, the trainer's do not): support {0, 2}, log p(2) = 1 - log(e^3 + e^1), finite
    value, _ = _one_position([3.0, 2.0, 1.0, 0.0], target=2, temperature=1.0, top_k=1)
    assert float(value) == pytest.approx(1 - math.log(math.exp(3) + math.exp(1)), abs=1e-6)


def test_rows_without_top_k_or_top_p_are_never_sorted(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sort(*args: object, **kwargs: object) -> object:
        raise AssertionError("sorted a row without top-k / top-p")

    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    logits_1TV = torch.randn(1, 4, V)
    ids_1T = torch.randint(0, V, (1, 4))
    scaled = TokenSampling(
        temperature_BT=torch.full((1, 4), 0.7),
        top_k_BT=torch.full((1, 4), -1),
        top_p_BT=torch.ones(1, 4),
    )
    lp, _ = token_logprobs(logits_1TV, ids_1T, sampling=scaled)
    ref, _ = token_logprobs(logits_1TV / 0.7, ids_1T)
    torch.testing.assert_close(lp, ref, atol=1e-6, rtol=0)
    with pytest.raises(AssertionError, match="sorted"):
        token_logprobs(
            logits_1TV, ids_1T, sampling=replace(scaled, top_p_BT=torch.full((1, 4), 0.9))
        )


def _sampled_items() -> list[SAWItem]:
    items = mixed_items(4, seed=7)
    metas = [
        {"behavior_sampling": {"temperature": 0.7, "top_k": -1, "top_p": 0.9}},
        {"behavior_sampling": {"temperature": 1.3, "top_k": 20, "top_p": 1.0}},
        {},
        {
            "behavior_sampling": [
                {"temperature": 0.5, "top_k": 5, "top_p": 0.8, "tokens": 2},
                {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "tokens": 100},
            ]
        },
    ]
    return [replace(s, meta={**s.meta, **m}) for s, m in zip(items, metas, strict=True)]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_sampling_transform_packed_chunked_and_recomputed_equal_padded(attn: str) -> None:
    batch = collate(_sampled_items())
    assert batch.sampling is not None
    results = []
    for packed, chunk in ((False, 1024), (True, 1024), (False, 5), (True, 3)):
        model = tiny_llama(seed=2)
        model.config._attn_implementation = attn
        lp, h = sequence_logprobs(
            model, batch, packed=packed, chunk_tokens=chunk, with_entropy=True
        )
        assert h is not None
        ((lp * batch.action_mask_BT).sum() + h.sum()).backward()
        results.append((lp.detach(), [p.grad.clone() for p in model.parameters()]))  # type: ignore[union-attr]
    (lp0, g0), *rest = results
    plain, _ = sequence_logprobs(tiny_llama(seed=2), replace(batch, sampling=None))
    assert ((lp0 - plain.detach()).abs() * batch.action_mask_BT).max() > 1e-2
    for lp, grads in rest:
        torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
        for a, b in zip(g0, grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def _entropy_and_logprobs(
    logits_V: list[float], temperature: float, top_k: int = -1
) -> tuple[torch.Tensor, list[float]]:
    """The entropy at one position sampled with (temperature, top_k), and the logprob the
    ratio reads for each possible token there."""
    vocab = len(logits_V)
    sampling = TokenSampling(
        temperature_BT=torch.tensor([[1.0, temperature]]),
        top_k_BT=torch.tensor([[-1, top_k]]),
        top_p_BT=torch.tensor([[1.0, 1.0]]),
    )
    logits_12V = torch.tensor([[logits_V, [0.0] * vocab]], requires_grad=True)
    _, h_12 = token_logprobs(
        logits_12V, torch.tensor([[0, 0]]), with_entropy=True, sampling=sampling
    )
    assert h_12 is not None
    lps = [
        float(token_logprobs(logits_12V, torch.tensor([[0, v]]), sampling=sampling)[0][0, 1])
        for v in range(vocab)
    ]
    return h_12[0, 1], lps


def test_entropy_is_of_the_tempered_distribution_the_ratio_reads() -> None:
    # logits [2, 1, 0] sampled at T = 0.7: p = softmax([2, 1, 0] / 0.7), H = -sum p log p;
    # the temperature-1 entropy (what it used to be) is larger: 0.832 against 0.651
    h, lps = _entropy_and_logprobs([2.0, 1.0, 0.0], temperature=0.7)
    z = [2.0 / 0.7, 1.0 / 0.7, 0.0]
    total = sum(math.exp(v) for v in z)
    by_hand = -sum(math.exp(v) / total * (v - math.log(total)) for v in z)
    assert float(h) == pytest.approx(by_hand, abs=1e-6) and by_hand == pytest.approx(
        0.6506, abs=1e-4
    )
    assert float(h) == pytest.approx(-sum(math.exp(lp) * lp for lp in lps), abs=1e-6)
    untempered, _ = _entropy_and_logprobs([2.0, 1.0, 0.0], temperature=1.0)
    assert float(untempered) == pytest.approx(0.8324, abs=1e-4)


def test_entropy_under_top_k_is_of_the_renormalised_support_with_finite_gradients() -> None:
    # logits [3, 2, 1, 0], T = 0.5, top_k = 2: support {0, 1}, z = [6, 4]:
    #   p = [e^6, e^4] / (e^6 + e^4), H = -sum p log p over the two; the dropped tokens add 0
    h, lps = _entropy_and_logprobs([3.0, 2.0, 1.0, 0.0], temperature=0.5, top_k=2)
    p0 = math.exp(6) / (math.exp(6) + math.exp(4))
    assert float(h) == pytest.approx(-(p0 * math.log(p0) + (1 - p0) * math.log(1 - p0)), abs=1e-6)
    on_support = [lp for lp in lps[:2]]
    assert float(h) == pytest.approx(-sum(math.exp(lp) * lp for lp in on_support), abs=1e-6)
    logits_12V = torch.tensor([[[3.0, 2.0, 1.0, 0.0], [0.0] * 4]], requires_grad=True)
    sampling = TokenSampling(
        temperature_BT=torch.tensor([[1.0, 0.5]]),
        top_k_BT=torch.tensor([[-1, 2]]),
        top_p_BT=torch.tensor([[1.0, 1.0]]),
    )
    _, h_12 = token_logprobs(
        logits_12V, torch.tensor([[0, 0]]), with_entropy=True, sampling=sampling
    )
    assert h_12 is not None
    h_12[0, 1].backward()
    assert logits_12V.grad is not None and bool(torch.isfinite(logits_12V.grad).all())
    assert logits_12V.grad[0, 0, 2:].tolist() == [0.0, 0.0]  # off the support: no gradient
