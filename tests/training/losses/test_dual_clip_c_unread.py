"""dual_clip_c is read only by dual-clip PPO: a value given without dual_clip=True is named by an
`UnreadOptionWarning` (an ablation grid passes it to its arms without dual clip too), not
refused; a c no arm could use (<= 1) still is."""

from __future__ import annotations

import warnings

import pytest
import torch

from ludic.training import LossInputs, make_grpo
from ludic.training.losses import TokenClippedSurrogateLoss
from ludic.training.option_warnings import UnreadOptionWarning


def test_a_dual_clip_c_without_dual_clip_warns_once_naming_the_knob() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        arms = [make_grpo(dual_clip=on, dual_clip_c=5.0) for on in (False, False, True)]
    assert [str(w.message) for w in caught if issubclass(w.category, UnreadOptionWarning)] == [
        "TokenClippedSurrogateLoss: dual_clip_c=5.0 is ignored: it is read only with dual_clip=True"
    ]
    assert [arm.loss.dual_clip for arm in arms] == [False, False, True]


def test_a_dual_clip_c_no_arm_could_use_is_refused() -> None:
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        make_grpo(dual_clip=False, dual_clip_c=0.5)


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
