"""The one input contract of the loss family: `prepare` checks `LossInputs` and builds the
`LossBatch` every formula reads, and a loss written as `AggregatedLoss.compute` alone gets the
checks, the declared-needs refusal and the aggregation modes for free.

Micro-batch (B = 2, T = 3): mask = [[0, 1, 1], [0, 1, 0]], masked slots hold nan / -inf garbage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from ludic.training.algorithm_types import Aggregation, Loss, LossInputs, LossOutput
from ludic.training.losses import (
    AGGREGATIONS,
    AggregatedLoss,
    CompositeLoss,
    GMPOLoss,
    LossBatch,
    ReinforceLoss,
    SequenceClippedSurrogateLoss,
    prepare,
)

MASK = [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]


def inputs(*, behavior: bool, **extra: torch.Tensor) -> tuple[LossInputs, torch.Tensor]:
    logp = torch.tensor([[float("nan"), -1.0, -2.0], [-float("inf"), -0.5, float("nan")]])
    logp.requires_grad_(True)
    mask = torch.tensor(MASK)
    fields: dict[str, torch.Tensor] = {"behavior_logprobs_BT": torch.full((2, 3), -1.5)}
    return LossInputs(
        logprobs_BT=logp,
        action_mask_BT=mask,
        advantages_B=torch.tensor([2.0, -1.0]),
        total_action_tokens=3.0,
        total_sequences=2.0,
        **(fields if behavior else {}),
        **extra,
    ), logp


def test_prepare_zeroes_masked_slots_and_gives_ratio_one_without_behaviour() -> None:
    batch = prepare(inputs(behavior=False)[0])
    assert batch.mask_BT.dtype == torch.bool
    # garbage (nan, -inf) in masked slots becomes an exact 0.0
    torch.testing.assert_close(
        batch.logprobs_BT.detach(), torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]])
    )
    assert not batch.has_behavior_logprobs
    assert bool((batch.log_ratio_BT == 0).all())  # mu := sg(pi): r = 1 on every token
    assert batch.advantages_B1.shape == (2, 1)
    # with behaviour -1.5 the log ratio is logp + 1.5 on action tokens, 0 elsewhere
    with_mu = prepare(inputs(behavior=True)[0])
    torch.testing.assert_close(
        with_mu.log_ratio_BT.detach(), torch.tensor([[0.0, 0.5, -0.5], [0.0, 1.0, 0.0]])
    )
    assert with_mu.share(torch.ones(2, 3)) == pytest.approx(1.0)  # 3 action tokens / 3


def test_prepare_clamps_the_log_ratio_before_any_exp() -> None:
    far, _ = inputs(behavior=False, behavior_logprobs_BT=torch.full((2, 3), -1e4))
    assert float(prepare(far).log_ratio_BT.detach().max()) == 20.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PlainPolicyGradient(AggregatedLoss):
    """loss = agg(-A * log pi): the formula only, as a user would write a new loss."""

    name: ClassVar[str] = "plain"

    def compute(self, batch: LossBatch) -> LossOutput:
        return LossOutput(loss=-self.reduce(batch.advantages_B1 * batch.logprobs_BT, batch))


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_a_loss_written_as_its_formula_alone_matches_reinforce(mode: Aggregation) -> None:
    custom = PlainPolicyGradient(aggregation=mode, constant_normalizer=4.0)
    reference = ReinforceLoss(aggregation=mode, constant_normalizer=4.0)
    assert isinstance(custom, Loss)
    assert not custom.needs_ref_logprobs and not custom.needs_entropy
    got, logp = inputs(behavior=True)
    want, logp_ref = inputs(behavior=True)
    custom(got).loss.backward()
    reference(want).loss.backward()
    assert custom(got).loss.item() == pytest.approx(reference(want).loss.item(), abs=1e-6)
    assert logp.grad is not None and logp_ref.grad is not None
    torch.testing.assert_close(logp.grad, logp_ref.grad, atol=1e-6, rtol=0)
    assert bool((logp.grad[torch.tensor(MASK) == 0] == 0).all())  # masked: exactly 0


def test_the_shared_checks_cover_a_new_loss() -> None:
    with pytest.raises(ValueError, match="aggregation must be one of"):
        PlainPolicyGradient(aggregation="mean")  # type: ignore[arg-type]
    bad, _ = inputs(behavior=False, is_weights_BT=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"is_weights_BT has shape \(2, 4\)"):
        PlainPolicyGradient()(bad)


@dataclass(frozen=True, kw_only=True, slots=True)
class NeedsBoth(PlainPolicyGradient):
    name: ClassVar[str] = "needs_both"
    needs_ref_logprobs: ClassVar[bool] = True
    needs_entropy: ClassVar[bool] = True


def test_declared_needs_are_refused_clearly_and_reported_by_composites() -> None:
    plain, _ = inputs(behavior=True)
    with pytest.raises(ValueError, match=r"NeedsBoth needs LossInputs\.ref_logprobs_BT"):
        NeedsBoth()(plain)
    ref_only, _ = inputs(behavior=True, ref_logprobs_BT=torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"NeedsBoth needs LossInputs\.entropy_BT"):
        NeedsBoth()(ref_only)
    both, _ = inputs(behavior=True, ref_logprobs_BT=torch.zeros(2, 3), entropy_BT=torch.ones(2, 3))
    assert torch.isfinite(NeedsBoth()(both).loss)
    composite = CompositeLoss(terms=[(1.0, PlainPolicyGradient()), (0.5, NeedsBoth())])
    assert composite.needs_ref_logprobs and composite.needs_entropy
    assert set(composite(both).metrics) == {"plain/loss", "needs_both/loss"}


def test_clip_ranges_are_checked_the_same_way_for_sequence_losses() -> None:
    with pytest.raises(ValueError, match=r"0 <= eps_low <= 1\.0"):
        SequenceClippedSurrogateLoss(clip_eps_low=1.5)
    with pytest.raises(ValueError, match="GMPOLoss: clip epsilons must satisfy 0 <= eps_low and"):
        GMPOLoss(clip_eps_low=-0.1)
    assert GMPOLoss(clip_eps_low=2.0).clip_eps_low == 2.0  # log-space clip: no upper bound
