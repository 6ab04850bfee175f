"""Properties every loss must keep, for every aggregation mode: masked tokens get exactly zero
gradient (even when their logprobs are -inf or nan), and micro-batches with batch-wide totals sum
to the one-big-batch loss, gradients and additive metrics."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ludic.training.algorithm_types import Aggregation, Loss, LossInputs
from ludic.training.losses import (
    AGGREGATIONS,
    CISPOLoss,
    CompositeLoss,
    EntropyBonus,
    GMPOLoss,
    KLToReferenceLoss,
    MaskedCrossEntropyLoss,
    ReinforceLoss,
    RejectOutside,
    RolloutCorrection,
    SequenceClippedSurrogateLoss,
    TokenClippedSurrogateLoss,
    TruncatedIS,
    reduce_metrics,
)

C = 7.0  # constant normaliser for the "constant" mode

LOSSES: dict[str, Callable[[Aggregation], Loss]] = {
    "reinforce": lambda m: ReinforceLoss(aggregation=m, constant_normalizer=C),
    "reinforce_tis": lambda m: ReinforceLoss(
        aggregation=m, constant_normalizer=C, truncated_is_cap=1.1
    ),
    "ppo": lambda m: TokenClippedSurrogateLoss(
        aggregation=m, constant_normalizer=C, clip_eps_low=0.1, clip_eps_high=0.15
    ),
    "gspo": lambda m: SequenceClippedSurrogateLoss(
        aggregation=m, constant_normalizer=C, clip_eps_low=0.05, clip_eps_high=0.05
    ),
    "cispo": lambda m: CISPOLoss(aggregation=m, constant_normalizer=C, clip_eps_high=0.1),
    "gmpo": lambda m: GMPOLoss(
        aggregation=m, constant_normalizer=C, clip_eps_low=0.1, clip_eps_high=0.1
    ),
    "rollout_tis_token": lambda m: RolloutCorrection(
        loss=TokenClippedSurrogateLoss(aggregation=m, constant_normalizer=C),
        corrections=[TruncatedIS(cap=1.2), RejectOutside(low=0.8, high=1.5)],
    ),
    "rollout_sequence": lambda m: RolloutCorrection(
        loss=GMPOLoss(aggregation=m, constant_normalizer=C),
        corrections=[
            RejectOutside(level="sequence", low=0.5, high=2.0),
            TruncatedIS(level="geometric", cap=1.1),
        ],
    ),
    "sft": lambda m: MaskedCrossEntropyLoss(aggregation=m, constant_normalizer=C),
    "kl_k1": lambda m: KLToReferenceLoss(aggregation=m, constant_normalizer=C, estimator="k1"),
    "kl_k2": lambda m: KLToReferenceLoss(aggregation=m, constant_normalizer=C, estimator="k2"),
    "kl_k3": lambda m: KLToReferenceLoss(aggregation=m, constant_normalizer=C, estimator="k3"),
    "entropy": lambda m: EntropyBonus(aggregation=m, constant_normalizer=C),
    "composite": lambda m: CompositeLoss(
        terms=[
            (1.0, TokenClippedSurrogateLoss(aggregation=m, constant_normalizer=C)),
            (0.1, KLToReferenceLoss(aggregation=m, constant_normalizer=C)),
            (0.01, EntropyBonus(aggregation=m, constant_normalizer=C)),
        ]
    ),
}

CASES = [(name, mode) for name in LOSSES for mode in AGGREGATIONS]


def random_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """B = 5 sequences, T = 7 tokens; row 3 has no action token at all."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(5, 7, generator=g) > 0.35).float()
    mask[:, 0] = 0.0
    mask[0, 1] = 1.0
    mask[3] = 0.0
    logp = -torch.rand(5, 7, generator=g) * 3 - 0.05
    return {
        "logp": logp,
        "mask": mask,
        "behavior": (logp + 0.3 * torch.randn(5, 7, generator=g)) * mask,
        "ref": logp + 0.5 * torch.randn(5, 7, generator=g),
        "entropy": torch.rand(5, 7, generator=g) * 2,
        "adv": torch.tensor([1.5, -0.7, 0.4, 2.0, -1.2]),
    }


def inputs_for(
    data: dict[str, torch.Tensor], logp: torch.Tensor, rows: slice, totals: tuple[float, float]
) -> LossInputs:
    return LossInputs(
        logprobs_BT=logp[rows],
        action_mask_BT=data["mask"][rows],
        advantages_B=data["adv"][rows],
        total_action_tokens=totals[0],
        total_sequences=totals[1],
        behavior_logprobs_BT=data["behavior"][rows],
        ref_logprobs_BT=data["ref"][rows],
        # an entropy that depends on the policy, so the entropy bonus has a gradient too
        entropy_BT=data["entropy"][rows] - 0.1 * logp[rows],
    )


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_micro_batches_sum_to_the_big_batch(name: str, mode: Aggregation) -> None:
    loss_fn = LOSSES[name](mode)
    data = random_batch()
    totals = (float(data["mask"].sum()), 5.0)

    big_logp = data["logp"].clone().requires_grad_(True)
    big = loss_fn(inputs_for(data, big_logp, slice(0, 5), totals))
    big.loss.backward()

    for split in ([slice(0, 2), slice(2, 5)], [slice(0, 1), slice(1, 4), slice(4, 5)]):
        logp = data["logp"].clone().requires_grad_(True)
        total = torch.zeros(())
        metrics = []
        for rows in split:
            out = loss_fn(inputs_for(data, logp, rows, totals))
            out.loss.backward()  # gradient accumulation
            total = total + out.loss.detach()
            metrics.append(out.metrics)
        torch.testing.assert_close(total, big.loss.detach(), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(logp.grad, big_logp.grad, atol=1e-6, rtol=1e-6)
        merged = reduce_metrics(metrics)
        assert merged.keys() == big.metrics.keys()
        for key, value in big.metrics.items():
            assert merged[key] == pytest.approx(value, abs=1e-6), key


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_masked_tokens_get_exactly_zero_gradient_even_from_garbage(
    name: str, mode: Aggregation
) -> None:
    loss_fn = LOSSES[name](mode)
    data = random_batch(seed=1)
    off = data["mask"] == 0
    totals = (float(data["mask"].sum()), 5.0)
    clean = loss_fn(inputs_for(data, data["logp"], slice(0, 5), totals)).loss.item()

    garbage = torch.full_like(data["logp"], float("-inf"))
    garbage[:, ::2] = float("nan")  # -inf and nan alternate on masked positions
    for key in ("logp", "behavior", "ref", "entropy"):
        data[key] = torch.where(off, garbage, data[key])
    logp = data["logp"].clone().requires_grad_(True)
    out = loss_fn(inputs_for(data, logp, slice(0, 5), totals))
    out.loss.backward()
    assert logp.grad is not None
    assert torch.isfinite(out.loss)
    assert out.loss.item() == pytest.approx(clean, abs=1e-6)
    assert torch.all(logp.grad[off] == 0.0)
    assert torch.isfinite(logp.grad).all()
    assert all(v == v for v in out.metrics.values())  # no nan metric
