"""The trainer's batch-invariant forward (`ludic.training.invariant_forward`): its logprobs are the
batch-invariant engine's behaviour logprobs bit for bit (float32, T=0.7, top-p 0.9, top-k, rows
of many lengths batched together), its logits and gradients are the model's own up to rounding,
and what it cannot do is refused with a clear message."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import torch

from ludic.inference import ChatRequest, ChatResponse, SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.models import build_tiny_model
from ludic.training import TrainerConfig
from ludic.training.collate import CollatedBatch, TokenSampling
from ludic.training.invariant_forward import InvariantForward, invariant_logits
from ludic.training.logprobs import sequence_logprobs


def _requests() -> list[ChatRequest]:
    out = []
    for i in range(6):
        sampling = SamplingConfig(
            temperature=0.7, top_p=0.9, top_k=-1 if i % 2 else 30, max_tokens=30, seed=i
        )
        content = "Board: " + "X O " * (3 * i) + f"move {i}"
        out.append(ChatRequest(messages=[{"role": "user", "content": content}], sampling=sampling))
    return out


def _batch(responses: list[ChatResponse], requests: list[ChatRequest]) -> CollatedBatch:
    """Prompt + completion of each response as right-padded rows, with its sampling knobs."""
    rows = [[*r.prompt_token_ids, *r.completion_token_ids] for r in responses]
    B, T = len(rows), max(map(len, rows))
    ids_BT = torch.zeros(B, T, dtype=torch.long)
    mask_BT = torch.zeros(B, T, dtype=torch.long)
    temperature_BT = torch.ones(B, T)
    top_k_BT = torch.full((B, T), -1, dtype=torch.long)
    top_p_BT = torch.ones(B, T)
    for b, (row, request) in enumerate(zip(rows, requests, strict=True)):
        ids_BT[b, : len(row)], mask_BT[b, : len(row)] = torch.tensor(row), 1
        start = len(responses[b].prompt_token_ids)
        temperature_BT[b, start : len(row)] = request.sampling.temperature
        top_k_BT[b, start : len(row)] = request.sampling.top_k
        top_p_BT[b, start : len(row)] = request.sampling.top_p
    return CollatedBatch(
        input_ids_BT=ids_BT,
        attention_mask_BT=mask_BT,
        action_mask_BT=mask_BT.float(),
        advantages_B=torch.zeros(B),
        sampling=TokenSampling(temperature_BT=temperature_BT, top_k_BT=top_k_BT, top_p_BT=top_p_BT),
    )


def _complete_together(model: Any, tokenizer: Any, requests: list[ChatRequest]) -> list[Any]:
    async def run() -> list[ChatResponse]:
        config = EngineConfig(batch_invariant=True)
        with EmbeddedEngine(copy.deepcopy(model), tokenizer, config=config) as engine:
            return list(await asyncio.gather(*(engine.complete(r) for r in requests)))

    return asyncio.run(run())


@pytest.mark.slow
def test_recomputed_logprobs_are_the_engines_behaviour_logprobs_bit_for_bit() -> None:
    model, tokenizer = build_tiny_model(seed=0)
    requests = _requests()
    responses = _complete_together(model, tokenizer, requests)
    batch = _batch(responses, requests)
    logprobs_BT, _ = sequence_logprobs(model, batch, batch_invariant=True)
    default_BT, _ = sequence_logprobs(model, batch)
    differs = False
    for b, response in enumerate(responses):
        start = len(response.prompt_token_ids)
        behaviour_L = torch.tensor(response.completion_logprobs, dtype=torch.float32)
        assert len(behaviour_L) > 5
        recomputed_L = logprobs_BT[b, start : start + len(behaviour_L)]
        assert torch.equal(recomputed_L, behaviour_L), (b, (recomputed_L - behaviour_L).abs().max())
        default_L = default_BT[b, start : start + len(behaviour_L)]
        differs |= not torch.equal(default_L, behaviour_L)
    assert differs  # the transformers forward rounds differently: the check can fail


def test_logits_and_gradients_are_the_models_own_up_to_rounding() -> None:
    model, _ = build_tiny_model(seed=0)
    generator = torch.Generator().manual_seed(0)
    ids_BT = torch.randint(0, model.config.vocab_size, (3, 40), generator=generator)
    mask_BT = torch.ones_like(ids_BT)
    mask_BT[1, 30:] = 0  # right padding
    mask_BT[2, 11:] = 0
    ours_BTV = invariant_logits(model, ids_BT, mask_BT)
    ours_BTV[mask_BT > 0].logsumexp(-1).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    theirs_BTV = model(input_ids=ids_BT, attention_mask=mask_BT).logits
    theirs_BTV[mask_BT > 0].logsumexp(-1).sum().backward()
    real = mask_BT > 0
    torch.testing.assert_close(ours_BTV[real], theirs_BTV[real], atol=1e-4, rtol=1e-4)
    assert set(ours) == {n for n, _ in model.named_parameters()}  # every weight gets a gradient
    for name, param in model.named_parameters():
        torch.testing.assert_close(ours[name], param.grad, atol=1e-4, rtol=1e-3, msg=name)


def test_what_the_invariant_forward_cannot_do_is_refused() -> None:
    model, _ = build_tiny_model(seed=0)
    ids_BT = torch.ones(2, 4, dtype=torch.long)
    left_padded = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        invariant_logits(model, ids_BT, left_padded)
    with pytest.raises(ValueError, match="packing"):
        TrainerConfig(batch_invariant=True, packing=True)
    with pytest.raises(ValueError, match=r"autocast to dtype='bfloat16'.*dtype='float32'"):
        TrainerConfig(batch_invariant=True, packing=False, dtype="bfloat16")
    batch = CollatedBatch(
        input_ids_BT=ids_BT,
        attention_mask_BT=torch.ones_like(ids_BT),
        action_mask_BT=torch.ones(2, 4),
        advantages_B=torch.zeros(2),
    )
    with pytest.raises(ValueError, match="packing off"):
        sequence_logprobs(model, batch, packed=True, batch_invariant=True)
    model.config.model_type = "gpt2"
    with pytest.raises(ValueError, match=r"model type 'gpt2'.*turn batch_invariant off"):
        InvariantForward(model)
