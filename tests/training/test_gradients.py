"""Gradient accumulation equals one big batch, for every aggregation and layout."""

from __future__ import annotations

import pytest
import torch
from training_fakes import WeightedNLL, mixed_items, tiny_llama

from ludic.training import (
    MaskedCrossEntropyLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
    accumulate_gradients,
    collate,
    plan_micro_batches,
)
from ludic.training.algorithm_types import Loss

LOSSES: dict[str, Loss] = {
    "grpo_seq_mean_token_mean": TokenClippedSurrogateLoss(aggregation="seq_mean_token_mean"),
    "token_mean": TokenClippedSurrogateLoss(aggregation="token_mean"),
    "reinforce_seq_sum": ReinforceLoss(aggregation="seq_mean_token_sum"),
    "dr_grpo_constant": TokenClippedSurrogateLoss(aggregation="constant", constant_normalizer=16.0),
    "sft": MaskedCrossEntropyLoss(),
    "test_loss": WeightedNLL(),
}


def _grads(
    loss: Loss, budget: int | None, packed: bool = False
) -> tuple[float, list[torch.Tensor], int]:
    model = tiny_llama(seed=1)
    batch = collate(mixed_items(7, seed=5))
    plan = plan_micro_batches(batch.lengths_B.tolist(), budget, packed=packed)
    result = accumulate_gradients(model, loss, batch, plan, packed=packed)
    assert result.finite
    return result.loss, [p.grad.clone() for p in model.parameters()], len(plan)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", list(LOSSES))
def test_micro_batches_equal_one_big_batch(name: str) -> None:
    loss = LOSSES[name]
    big_loss, big_grads, n_big = _grads(loss, None)
    assert n_big == 1
    for budget, packed in ((40, False), (1, False), (30, True)):
        small_loss, small_grads, n_small = _grads(loss, budget, packed)
        assert n_small > 1
        assert small_loss == pytest.approx(big_loss, rel=1e-6)
        for a, b in zip(big_grads, small_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_nonfinite_loss_stops_before_backward() -> None:
    model = tiny_llama()
    batch = collate(mixed_items(4))
    result = accumulate_gradients(model, WeightedNLL(poison=True), batch, [[0, 1], [2, 3]])
    assert not result.finite and result.num_micro_batches == 1
    assert all(p.grad is None for p in model.parameters())


def test_reference_model_required_when_loss_needs_it() -> None:
    from ludic.training import KLToReferenceLoss

    with pytest.raises(ValueError, match="ref_model"):
        accumulate_gradients(tiny_llama(), KLToReferenceLoss(), collate(mixed_items(2)), [[0, 1]])
