"""README "## Training": the custom-loss example's arithmetic under every aggregation mode, and
its claim that each mode is normalised over the whole optimizer batch, so micro-batches that
carry the batch's totals sum to the one-pass loss and gradient (gradient accumulation equals
one big batch). Values are derived by hand from the README's own inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from ludic.training import LossInputs, LossOutput
from ludic.training.losses import AggregatedLoss, LossBatch


@dataclass(frozen=True, kw_only=True, slots=True)
class ClippedAdvantageReinforce(AggregatedLoss):
    """The README's example loss: agg(-clip(A, -c, c) * log pi(a_t) - beta * H_t)."""

    name: ClassVar[str] = "clipped_advantage_reinforce"
    needs_entropy: ClassVar[bool] = True
    advantage_clip: float = 1.0
    entropy_beta: float = 0.01

    def compute(self, batch: LossBatch) -> LossOutput:
        advantages_B1 = batch.advantages_B1.clamp(-self.advantage_clip, self.advantage_clip)
        objective_BT = advantages_B1 * batch.logprobs_BT + self.entropy_beta * batch.entropy_BT
        return LossOutput(loss=-self.reduce(batch.corrected(objective_BT), batch), metrics={})


LOGPROBS = [[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]]
MASK = [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]
ADVANTAGES = [3.0, -0.5]  # the first is clipped to 1
CONSTANT = 4.0
# Per-token objectives A * logprob on the action tokens: row 0: -1, -2; row 1: 0.25.
EXPECTED = {
    "token_mean": (1.0 + 2.0 - 0.25) / 3,  # over the batch's 3 action tokens
    "seq_mean_token_mean": (1.5 - 0.25) / 2,  # the README's 0.625
    "seq_mean_token_sum": (3.0 - 0.25) / 2,
    "constant": (3.0 - 0.25) / (2 * CONSTANT),
    "token_sum": 3.0 - 0.25,
}


def _loss(mode: str) -> ClippedAdvantageReinforce:
    normalizer = CONSTANT if mode == "constant" else None
    return ClippedAdvantageReinforce(aggregation=mode, constant_normalizer=normalizer)  # type: ignore[arg-type]


def _inputs(rows: slice, logprobs_BT: torch.Tensor) -> LossInputs:
    return LossInputs(
        logprobs_BT=logprobs_BT[rows],
        action_mask_BT=torch.tensor(MASK)[rows],
        advantages_B=torch.tensor(ADVANTAGES)[rows],
        entropy_BT=torch.zeros(2, 3)[rows],
        total_action_tokens=3,
        total_sequences=2,
    )


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_every_mode_gives_the_hand_derived_loss(mode: str) -> None:
    logprobs_BT = torch.tensor(LOGPROBS, requires_grad=True)
    out = _loss(mode)(_inputs(slice(None), logprobs_BT))
    assert out.loss.item() == pytest.approx(EXPECTED[mode], abs=1e-6)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_micro_batches_sum_to_the_one_pass_loss_and_gradient(mode: str) -> None:
    whole = torch.tensor(LOGPROBS, requires_grad=True)
    _loss(mode)(_inputs(slice(None), whole)).loss.backward()
    split = torch.tensor(LOGPROBS, requires_grad=True)
    total = sum(_loss(mode)(_inputs(rows, split)).loss for rows in (slice(0, 1), slice(1, 2)))
    total.backward()  # type: ignore[union-attr]
    assert total.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    assert whole.grad is not None and split.grad is not None
    torch.testing.assert_close(split.grad, whole.grad)
    assert whole.grad[:, 0].eq(0).all()  # masked tokens get exactly zero gradient
