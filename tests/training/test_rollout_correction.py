"""Rollout IS correction on hand-computed values, and the identity without mismatch.

Micro-batch (B = 2, T = 4, 5 action tokens), current logprobs pi and rho = pi_old / mu with
pi_old = sg(pi) (one optimizer step per batch):
    row 0: action tokens t = 1, 2, 3   log pi = [-1.0, -2.0, -0.5]   rho = [2, 0.25, 1]   A = +1
    row 1: action tokens t = 2, 3      log pi = [-0.3, -0.7]         rho = [3, 0.5]       A = -2
Sequence rho: row 0: 2 * 0.25 * 1 = 0.5, row 1: 3 * 0.5 = 1.5.
Base loss REINFORCE, token_mean: loss = -sum_t w_t A log pi_t / 5, d loss / d log pi_t = -w_t A / 5.
"""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training import make_grpo, with_rollout_correction
from ludic.training.algorithm_types import Loss, LossInputs
from ludic.training.losses import (
    CISPOLoss,
    GMPOLoss,
    ReinforceLoss,
    RejectOutside,
    RolloutCorrection,
    SequenceClippedSurrogateLoss,
    TokenClippedSurrogateLoss,
    TruncatedIS,
)
from ludic.training.losses.rollout_correction import Correction

TOL = 1e-6
MASK = [[0, 1, 1, 1], [0, 0, 1, 1]]
LOGP = [[0.0, -1.0, -2.0, -0.5], [0.0, 0.0, -0.3, -0.7]]
RHO = [[1.0, 2.0, 0.25, 1.0], [1.0, 1.0, 3.0, 0.5]]
ACTION = torch.tensor(MASK, dtype=torch.bool)


def inputs(*, mismatch: bool = True) -> LossInputs:
    logp = torch.tensor(LOGP, dtype=torch.float32, requires_grad=True)
    log_rho = torch.tensor(RHO, dtype=torch.float64).log()
    behavior = torch.tensor(LOGP, dtype=torch.float64) - (log_rho if mismatch else 0.0)
    return LossInputs(
        logprobs_BT=logp,
        action_mask_BT=torch.tensor(MASK, dtype=torch.float32),
        advantages_B=torch.tensor([1.0, -2.0]),
        total_action_tokens=5.0,
        total_sequences=2.0,
        behavior_logprobs_BT=behavior.float() * ACTION,
    )


def loss_and_grad(loss: Loss, batch: LossInputs) -> tuple[float, list[float], dict[str, float]]:
    out = loss(batch)
    out.loss.backward()
    grad = batch.logprobs_BT.grad
    assert grad is not None
    assert bool((grad[~ACTION] == 0).all())  # masked tokens get exactly zero gradient
    return float(out.loss.detach()), grad[ACTION].tolist(), out.metrics


def corrected(*corrections: Correction) -> RolloutCorrection:
    return RolloutCorrection(loss=ReinforceLoss(), corrections=corrections)


def test_token_tis_truncates_each_token_ratio_at_the_cap() -> None:
    # w = min(rho, 2.5) = [2, 0.25, 1 | 2.5, 0.5]
    # loss = -(1 * (2 * -1 + 0.25 * -2 + 1 * -0.5) - 2 * (2.5 * -0.3 + 0.5 * -0.7)) / 5
    #      = -(-3 + 2.2) / 5 = 0.16;  grad = -w A / 5 = [-0.4, -0.05, -0.2 | 1.0, 0.2]
    value, grad, metrics = loss_and_grad(corrected(TruncatedIS(cap=2.5)), inputs())
    assert value == pytest.approx(0.16, abs=TOL)
    assert grad == pytest.approx([-0.4, -0.05, -0.2, 1.0, 0.2], abs=TOL)
    assert metrics["rollout_is/tis_token_frac"] == pytest.approx(1 / 5, abs=TOL)  # rho 3
    assert metrics["rollout_is/weight_mean"] == pytest.approx(6.25 / 5, abs=TOL)


def test_sequence_tis_weighs_every_token_by_the_truncated_sequence_ratio() -> None:
    # w = [min(0.5, 1.2)] * 3 + [min(1.5, 1.2)] * 2 = [0.5, 0.5, 0.5 | 1.2, 1.2]
    # loss = -(0.5 * (-3.5) - 2 * 1.2 * (-1.0)) / 5 = -(-1.75 + 2.4) / 5 = -0.13
    # grad = -w A / 5 = [-0.1, -0.1, -0.1 | 0.48, 0.48]
    value, grad, metrics = loss_and_grad(
        corrected(TruncatedIS(level="sequence", cap=1.2)), inputs()
    )
    assert value == pytest.approx(-0.13, abs=TOL)
    assert grad == pytest.approx([-0.1, -0.1, -0.1, 0.48, 0.48], abs=TOL)
    assert metrics["rollout_is/tis_sequence_frac"] == pytest.approx(2 / 5, abs=TOL)


def test_geometric_level_uses_the_mean_token_log_ratio() -> None:
    # row 0: exp(mean(ln 2, ln 0.25, 0)) = 0.5^(1/3);  row 1: min(sqrt(1.5), 1.2) = 1.2
    w0, w1 = 0.5 ** (1 / 3), min(math.sqrt(1.5), 1.2)
    expected = -(w0 * -3.5 - 2 * w1 * -1.0) / 5
    value, grad, _ = loss_and_grad(corrected(TruncatedIS(level="geometric", cap=1.2)), inputs())
    assert value == pytest.approx(expected, abs=TOL)
    assert grad == pytest.approx([-w0 / 5] * 3 + [2 * w1 / 5] * 2, abs=TOL)


def test_token_rejection_drops_tokens_outside_the_band() -> None:
    # band [0.4, 2.5]: rho = [2 keep, 0.25 drop, 1 keep | 3 drop, 0.5 keep]
    # loss = -(1 * (-1 - 0.5) - 2 * (-0.7)) / 5 = -(-1.5 + 1.4) / 5 = 0.02
    value, grad, metrics = loss_and_grad(corrected(RejectOutside(low=0.4, high=2.5)), inputs())
    assert value == pytest.approx(0.02, abs=TOL)
    assert grad == pytest.approx([-0.2, 0.0, -0.2, 0.0, 0.4], abs=TOL)
    assert metrics["rollout_is/reject_token_frac"] == pytest.approx(2 / 5, abs=TOL)


def test_sequence_rejection_drops_whole_sequences() -> None:
    # band [0.4, 1.4]: row 0 (0.5) kept, row 1 (1.5) rejected: loss = -(-3.5) / 5 = 0.7
    value, grad, metrics = loss_and_grad(
        corrected(RejectOutside(level="sequence", low=0.4, high=1.4)), inputs()
    )
    assert value == pytest.approx(0.7, abs=TOL)
    assert grad == pytest.approx([-0.2, -0.2, -0.2, 0.0, 0.0], abs=TOL)
    assert metrics["rollout_is/reject_sequence_frac"] == pytest.approx(2 / 5, abs=TOL)


def test_corrections_compose_by_multiplying_their_weights() -> None:
    # token TIS (cap 2.5) x sequence rejection [0.4, 1.4]: w = [2, 0.25, 1 | 0, 0]
    # loss = -(-3) / 5 = 0.6
    loss = corrected(TruncatedIS(cap=2.5), RejectOutside(level="sequence", low=0.4, high=1.4))
    value, grad, _ = loss_and_grad(loss, inputs())
    assert value == pytest.approx(0.6, abs=TOL)
    assert grad == pytest.approx([-0.4, -0.05, -0.2, 0.0, 0.0], abs=TOL)


def test_the_wrapped_ratio_is_against_the_trainers_own_logprobs() -> None:
    # PPO's clipped surrogate inside the correction: r = pi / sg(pi) = 1, so the clip never acts
    # and loss = -sum w A / 5 = -(1 * 3.25 - 2 * 3.0) / 5 = 0.55 with w = min(rho, 2.5),
    # gradient -w A / 5 as for REINFORCE.
    loss = RolloutCorrection(loss=TokenClippedSurrogateLoss(), corrections=[TruncatedIS(cap=2.5)])
    value, grad, metrics = loss_and_grad(loss, inputs())
    assert value == pytest.approx(0.55, abs=TOL)
    assert grad == pytest.approx([-0.4, -0.05, -0.2, 1.0, 0.2], abs=TOL)
    assert metrics["clip_frac"] == 0.0
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=TOL)


POLICY_LOSSES: list[Loss] = [
    ReinforceLoss(),
    ReinforceLoss(truncated_is_cap=2.0, aggregation="seq_mean_token_sum"),
    TokenClippedSurrogateLoss(aggregation="seq_mean_token_mean"),
    CISPOLoss(),
    SequenceClippedSurrogateLoss(),
    GMPOLoss(),
]
CORRECTIONS: list[Correction] = [
    TruncatedIS(cap=2.0),
    TruncatedIS(level="sequence", cap=1.0),
    TruncatedIS(level="geometric", cap=3.0),
    RejectOutside(low=0.9, high=1.1),
    RejectOutside(level="sequence", low=1.0, high=1.0),
    RejectOutside(level="geometric", low=0.5, high=2.0),
]


@pytest.mark.parametrize("base", POLICY_LOSSES, ids=lambda loss: type(loss).__name__)
@pytest.mark.parametrize("correction", CORRECTIONS, ids=lambda c: c.label)
def test_without_mismatch_the_correction_is_the_identity(
    base: Loss, correction: Correction
) -> None:
    plain_value, plain_grad, _ = loss_and_grad(base, inputs(mismatch=False))
    wrapped = RolloutCorrection(loss=base, corrections=[correction])
    value, grad, metrics = loss_and_grad(wrapped, inputs(mismatch=False))
    assert value == pytest.approx(plain_value, abs=TOL)
    assert grad == pytest.approx(plain_grad, abs=TOL)
    assert metrics["rollout_is/weight_mean"] == pytest.approx(1.0, abs=TOL)
    assert metrics[f"rollout_is/{correction.label}_frac"] == 0.0


def test_with_mismatch_the_correction_changes_the_loss() -> None:
    # the control for the identity test: the same inputs with rho != 1 do differ
    plain_value, _, _ = loss_and_grad(ReinforceLoss(), inputs())
    value, _, _ = loss_and_grad(corrected(TruncatedIS(cap=2.0)), inputs())
    assert abs(value - plain_value) > 0.05  # 0.22 with cap 2 against 0.30 plain


def test_bad_configuration_and_missing_behaviour_logprobs_fail_clearly() -> None:
    with pytest.raises(ValueError, match="cap must be a finite number >= 1"):
        TruncatedIS(cap=0.5)
    with pytest.raises(ValueError, match="must contain ratio 1"):
        RejectOutside(low=1.5, high=2.0)
    with pytest.raises(ValueError, match="level must be one of"):
        TruncatedIS(level="turn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one correction"):
        RolloutCorrection(loss=ReinforceLoss(), corrections=[])
    no_behavior = inputs()
    no_behavior = LossInputs(
        logprobs_BT=no_behavior.logprobs_BT,
        action_mask_BT=no_behavior.action_mask_BT,
        advantages_B=no_behavior.advantages_B,
        total_action_tokens=5.0,
        total_sequences=2.0,
    )
    with pytest.raises(ValueError, match="needs behaviour logprobs"):
        corrected(TruncatedIS())(no_behavior)


def test_preset_helper_wraps_the_presets_loss() -> None:
    algorithm = with_rollout_correction(make_grpo(kl_beta=0.1), TruncatedIS(cap=2.0))
    assert isinstance(algorithm.loss, RolloutCorrection)
    assert algorithm.loss.needs_ref_logprobs  # the KL term is still there
    assert algorithm.name == "grpo"
