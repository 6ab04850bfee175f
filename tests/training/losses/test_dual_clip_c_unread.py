"""dual_clip_c is read only by dual-clip PPO: a value given without dual_clip=True is refused
(it would change nothing, silently), the default and any value with dual_clip=True are not."""

from __future__ import annotations

import pytest
import torch

from ludic.training import LossInputs, make_grpo
from ludic.training.losses import TokenClippedSurrogateLoss


def test_a_dual_clip_c_without_dual_clip_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"dual_clip_c=5.0 is read only with dual_clip=True"):
        TokenClippedSurrogateLoss(dual_clip_c=5.0)
    with pytest.raises(ValueError, match="pass dual_clip=True or drop dual_clip_c"):
        make_grpo(dual_clip_c=5.0)


def test_the_default_c_and_a_c_with_dual_clip_are_kept() -> None:
    assert TokenClippedSurrogateLoss(dual_clip_c=3.0).dual_clip_c == 3.0
    loss = TokenClippedSurrogateLoss(dual_clip=True, dual_clip_c=5.0)
    # one token, A = -1, ratio e^2 = 7.39: PPO's loss -min(r A, clip(r) A) = 7.39, floored at
    # -c A = 5 by the dual clip
    out = loss(
        LossInputs(
            logprobs_BT=torch.tensor([[0.0, 0.0]]),
            behavior_logprobs_BT=torch.tensor([[0.0, -2.0]]),
            action_mask_BT=torch.tensor([[0.0, 1.0]]),
            advantages_B=torch.tensor([-1.0]),
            total_action_tokens=1,
            total_sequences=1,
        )
    )
    assert abs(out.loss.item() - 5.0) < 1e-6
    assert out.metrics["dual_clip_frac"] == 1.0
