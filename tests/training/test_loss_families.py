"""Dual-clip PPO, token_sum aggregation and the abs / straight-through / clamped KL estimators:
hand-derived values and gradients (masked tokens get exactly zero gradient)."""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training import make_grpo
from ludic.training.algorithm_types import LossInputs
from ludic.training.losses import (
    CompositeLoss,
    KLEstimator,
    KLToReferenceLoss,
    TokenClippedSurrogateLoss,
    kl_estimate,
)

TOL = 1e-6


def one_sequence(ratios: list[float], advantage: float) -> tuple[LossInputs, torch.Tensor]:
    """One sequence: a masked first slot, then action tokens with r_t = ratios (mu = -1)."""
    logp = torch.tensor([0.0] + [-1.0 + math.log(r) for r in ratios]).unsqueeze(0)
    logp.requires_grad_(True)
    mask = torch.tensor([[0.0] + [1.0] * len(ratios)])
    inputs = LossInputs(
        logprobs_BT=logp,
        action_mask_BT=mask,
        advantages_B=torch.tensor([advantage]),
        behavior_logprobs_BT=-mask,
        total_action_tokens=float(len(ratios)),
        total_sequences=1.0,
    )
    return inputs, logp


def test_dual_clip_bounds_negative_advantage_tokens_by_hand() -> None:
    # A = -1, eps 0.2, c = 3, r = [5, 1.5, 0.5]; per token min(r A, clip(r) A) = -max(r, clip(r)):
    #   r = 5:   -5, dual floor c A = -3 -> -3 (no gradient: the floor is a constant)
    #   r = 1.5: -1.5 (unclipped, d/dlogp of -r = -1.5)
    #   r = 0.5: -0.8 (clipped branch, no gradient)
    # loss = -mean = (3 + 1.5 + 0.8) / 3; grad wrt logp = [0, 0, 1.5 / 3, 0]
    inputs, logp = one_sequence([5.0, 1.5, 0.5], -1.0)
    out = TokenClippedSurrogateLoss(dual_clip=True)(inputs)
    assert out.loss.item() == pytest.approx(5.3 / 3, abs=TOL)
    out.loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, 0.5, 0.0], abs=TOL)
    assert out.metrics["dual_clip_frac"] == pytest.approx(1 / 3, abs=TOL)
    # without the dual clip the r = 5 token costs 5 and keeps its gradient 5 / 3
    inputs, logp = one_sequence([5.0, 1.5, 0.5], -1.0)
    plain = TokenClippedSurrogateLoss()(inputs)
    assert plain.loss.item() == pytest.approx(7.3 / 3, abs=TOL)
    plain.loss.backward()
    assert logp.grad is not None and float(logp.grad[0, 1]) == pytest.approx(5 / 3, abs=TOL)


def test_dual_clip_leaves_positive_advantages_alone() -> None:
    # A = +1: min(r, clip(r)) = [1.2, 1.2, 0.5] -> loss -(2.9) / 3, the same with or without
    inputs, _ = one_sequence([5.0, 1.5, 0.5], 1.0)
    for loss in (TokenClippedSurrogateLoss(), TokenClippedSurrogateLoss(dual_clip=True)):
        assert loss(inputs).loss.item() == pytest.approx(-2.9 / 3, abs=TOL)
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        TokenClippedSurrogateLoss(dual_clip=True, dual_clip_c=1.0)


def test_token_sum_is_the_plain_sum_over_action_tokens() -> None:
    # A = -1, r = [5, 1.5, 0.5] without dual clip: per-token losses 5, 1.5, 0.8 -> sum 7.3
    inputs, _ = one_sequence([5.0, 1.5, 0.5], -1.0)
    out = TokenClippedSurrogateLoss(aggregation="token_sum")(inputs)
    assert out.loss.item() == pytest.approx(7.3, abs=TOL)


# logp = [-1, -2], ref = [-1.5, -0.5] -> d = ref - logp = [-0.5, 1.5]
LOGP = [-1.0, -2.0]
REF = [-1.5, -0.5]
D = [-0.5, 1.5]
K3 = [math.exp(d) - 1.0 - d for d in D]  # [0.106531, 1.981689]
CASES: list[tuple[KLEstimator, float | None, list[float], list[float]]] = [
    # (estimator, clamp, value per token, d value / d logp per token)
    ("k1", None, [0.5, -1.5], [1.0, 1.0]),  # -d, d(-d)/dlogp = 1
    ("abs", None, [0.5, 1.5], [1.0, -1.0]),  # |d|, sign(d) * (-1)
    ("k3", None, K3, [1.0 - math.exp(d) for d in D]),  # (e^d - 1) * (-1)
    ("k3", 1.0, [K3[0], 1.0], [1.0 - math.exp(D[0]), 0.0]),  # capped token: no gradient
    # straight-through: value of k1 / k3, gradient of k2 = d^2 / 2, i.e. -d
    ("k1+", None, [0.5, -1.5], [0.5, -1.5]),
    ("k3+", None, K3, [0.5, -1.5]),
    ("k3+", 1.0, [K3[0], 1.0], [0.5, -1.5]),
]


@pytest.mark.parametrize(("estimator", "clamp", "values", "grads"), CASES)
def test_kl_estimators_by_hand(
    estimator: KLEstimator, clamp: float | None, values: list[float], grads: list[float]
) -> None:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    kl = kl_estimate(logp, torch.tensor(REF, dtype=torch.float64), estimator, clamp=clamp)
    assert kl.tolist() == pytest.approx(values, abs=TOL)
    kl.sum().backward()
    assert logp.grad is not None and logp.grad.tolist() == pytest.approx(grads, abs=TOL)


def test_kl_loss_with_clamped_k3_and_masked_garbage() -> None:
    # tokens [masked, -1, -2] vs ref [nan-ish garbage, -1.5, -0.5]; token_mean of [K3[0], 1.0]
    logp = torch.tensor([[-50.0, -1.0, -2.0]], requires_grad=True)
    inputs = LossInputs(
        logprobs_BT=logp,
        action_mask_BT=torch.tensor([[0.0, 1.0, 1.0]]),
        advantages_B=torch.tensor([0.0]),
        ref_logprobs_BT=torch.tensor([[0.0, -1.5, -0.5]]),
        total_action_tokens=2.0,
        total_sequences=1.0,
    )
    out = KLToReferenceLoss(estimator="k3", clamp=1.0)(inputs)
    assert out.loss.item() == pytest.approx((K3[0] + 1.0) / 2, abs=TOL)
    out.loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist()[0] == pytest.approx([0.0, (1 - math.exp(-0.5)) / 2, 0.0], abs=TOL)


def test_bad_kl_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="clamp applies to 'k3'"):
        KLToReferenceLoss(estimator="k1", clamp=10.0)
    with pytest.raises(ValueError, match="estimator must be one of"):
        KLToReferenceLoss(estimator="k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="clamp must be > 0"):
        KLToReferenceLoss(estimator="k3", clamp=0.0)


def test_grpo_preset_wires_dual_clip_and_the_kl_options() -> None:
    algo = make_grpo(dual_clip=True, kl_beta=0.01, kl_estimator="k3+", kl_clamp=10.0)
    assert isinstance(algo.loss, CompositeLoss)
    (_, pg), (beta, kl) = algo.loss.terms
    assert isinstance(pg, TokenClippedSurrogateLoss) and pg.dual_clip and pg.dual_clip_c == 3.0
    assert beta == 0.01 and kl == KLToReferenceLoss(
        estimator="k3+", clamp=10.0, aggregation="seq_mean_token_mean"
    )
