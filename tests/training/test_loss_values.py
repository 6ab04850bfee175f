"""Hand-derived values, gradients and metrics of every loss.

Shared micro-batch (B = 2 sequences, T = 4 tokens, 5 action tokens):
    mask      = [[0, 1, 1, 0], [0, 1, 1, 1]]
    behaviour = -1 on every action token
    ratios    = [[_, 1.5, 0.9, _], [_, 0.5, 1.1, 1.0]]  ->  logp = -1 + log(ratio)
    A         = [+1, -1]
"""

from __future__ import annotations

import math
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
    KLEstimator,
    KLToReferenceLoss,
    MaskedCrossEntropyLoss,
    ReinforceLoss,
    SequenceClippedSurrogateLoss,
    TokenClippedSurrogateLoss,
    aggregate,
    reduce_metrics,
)

TOL = 1e-6
MASK = [[0, 1, 1, 0], [0, 1, 1, 1]]
RATIOS = [[1.0, 1.5, 0.9, 1.0], [1.0, 0.5, 1.1, 1.0]]


def batch(
    advantages: tuple[float, ...] = (1.0, -1.0),
    *,
    behavior: bool = True,
    ref: list[list[float]] | None = None,
    entropy: list[list[float]] | None = None,
) -> tuple[LossInputs, torch.Tensor]:
    logp = (-1.0 + torch.tensor(RATIOS, dtype=torch.float64).log()).float()
    logp = torch.where(torch.tensor(MASK, dtype=torch.bool), logp, torch.zeros_like(logp))
    logp.requires_grad_(True)
    mask = torch.tensor(MASK, dtype=torch.float32)
    inputs = LossInputs(
        logprobs_BT=logp,
        action_mask_BT=mask,
        advantages_B=torch.tensor(list(advantages)),
        total_action_tokens=5.0,
        total_sequences=2.0,
        behavior_logprobs_BT=-mask if behavior else None,
        ref_logprobs_BT=None if ref is None else torch.tensor(ref),
        entropy_BT=None if entropy is None else torch.tensor(entropy),
    )
    return inputs, logp


def grad_of(loss: Loss, inputs: LossInputs, logp: torch.Tensor) -> torch.Tensor:
    out = loss(inputs)
    out.loss.backward()
    assert logp.grad is not None
    return logp.grad


def test_aggregation_modes_by_hand() -> None:
    values = torch.tensor([[9.0, 1.0, 2.0, 9.0], [9.0, 3.0, 4.0, 5.0]])  # 9 = masked garbage
    mask = torch.tensor(MASK, dtype=torch.bool)

    def agg(mode: Aggregation, tokens: float = 5.0, seqs: float = 2.0) -> float:
        return float(
            aggregate(
                values,
                mask,
                mode,
                total_action_tokens=tokens,
                total_sequences=seqs,
                constant_normalizer=10.0,
            )
        )

    assert agg("token_mean") == pytest.approx(15 / 5, abs=TOL)  # (1+2+3+4+5) / 5
    assert agg("seq_mean_token_mean") == pytest.approx((1.5 + 4.0) / 2, abs=TOL)
    assert agg("seq_mean_token_sum") == pytest.approx(15 / 2, abs=TOL)
    assert agg("constant") == pytest.approx(15 / (2 * 10), abs=TOL)
    assert agg("token_sum") == pytest.approx(15.0, abs=TOL)  # no normaliser
    assert agg("token_sum", 10.0, 4.0) == pytest.approx(15.0, abs=TOL)  # same in any batch
    # as one micro-batch of a batch with 10 tokens and 4 sequences: batch-wide normalisers
    assert agg("token_mean", 10.0, 4.0) == pytest.approx(15 / 10, abs=TOL)
    assert agg("seq_mean_token_mean", 10.0, 4.0) == pytest.approx(5.5 / 4, abs=TOL)
    assert set(AGGREGATIONS) == {
        "token_mean",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "constant",
        "token_sum",
    }


def test_reinforce_value_and_gradient() -> None:
    # logp = [[_, -1+ln1.5, -1+ln.9, _], [_, -1+ln.5, -1+ln1.1, -1]]
    # loss = -(sum_t A*logp) / 5; d loss / d logp = -A / 5 = -0.2 (row 0), +0.2 (row 1)
    inputs, logp = batch()
    expected = (
        -((-2 + math.log(1.5) + math.log(0.9)) * 1.0 + (-3 + math.log(0.5) + math.log(1.1)) * -1.0)
        / 5
    )
    assert ReinforceLoss()(inputs).loss.item() == pytest.approx(expected, abs=TOL)
    g = grad_of(ReinforceLoss(), inputs, logp)
    torch.testing.assert_close(
        g, torch.tensor([[0.0, -0.2, -0.2, 0.0], [0.0, 0.2, 0.2, 0.2]]), atol=TOL, rtol=0
    )


def test_reinforce_truncated_importance_sampling() -> None:
    # w = sg(min(r, 1.2)) = [[_, 1.2, .9, _], [_, .5, 1.1, 1]]; gradient -w*A/5
    inputs, logp = batch()
    loss = ReinforceLoss(truncated_is_cap=1.2)
    out = loss(inputs)
    w = [[0, 1.2, 0.9, 0], [0, 0.5, 1.1, 1.0]]
    lp = logp.detach().tolist()
    expected = (
        -(sum(w[0][t] * lp[0][t] for t in range(4)) - sum(w[1][t] * lp[1][t] for t in range(4))) / 5
    )
    assert out.loss.item() == pytest.approx(expected, abs=TOL)
    assert out.metrics["clip_frac"] == pytest.approx(1 / 5, abs=TOL)  # only 1.5 was capped
    out.loss.backward()
    expected_grad = torch.tensor([[0, -1.2, -0.9, 0], [0, 0.5, 1.1, 1.0]]) / 5
    torch.testing.assert_close(logp.grad, expected_grad, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="behaviour logprobs"):
        loss(batch(behavior=False)[0])


def test_token_clipped_surrogate_clip_active_and_inactive() -> None:
    # eps_low 0.2, eps_high 0.28 (DAPO): bounds [0.8, 1.28]
    # row 0 (A=+1): r=1.5 -> min(1.5, 1.28) = 1.28, clipped, zero grad
    #               r=0.9 -> 0.9 inside the range, grad d(-r)/dlogp / 5 = -0.9/5
    # row 1 (A=-1): r=0.5 -> min(-0.5, -0.8) = -0.8, clipped, zero grad
    #               r=1.1 -> -1.1, grad +1.1/5; r=1.0 -> -1.0, grad +1.0/5
    # loss = -(1.28 + 0.9 - 0.8 - 1.1 - 1.0) / 5 = 0.144
    inputs, logp = batch()
    loss = TokenClippedSurrogateLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    out = loss(inputs)
    assert out.loss.item() == pytest.approx(0.144, abs=TOL)
    out.loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0, 0, -0.9, 0], [0, 0, 1.1, 1.0]]) / 5, atol=TOL, rtol=0
    )
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.9, 0.5, 1.1, 1.0)) / 5
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5, abs=TOL)
    assert out.metrics["ratio_mean"] == pytest.approx(5.0 / 5, abs=TOL)
    assert out.metrics["ratio_min"] == pytest.approx(0.5, abs=TOL)
    assert out.metrics["ratio_max"] == pytest.approx(1.5, abs=TOL)
    assert out.metrics["approx_kl"] == pytest.approx(k3, abs=TOL)
    # wider range [0.4, 1.6]: nothing clipped, loss = -(1.5 + .9 - .5 - 1.1 - 1) / 5 = 0.04
    wide = TokenClippedSurrogateLoss(clip_eps_low=0.6, clip_eps_high=0.6)(batch()[0])
    assert wide.loss.item() == pytest.approx(0.04, abs=TOL)
    assert wide.metrics["clip_frac"] == 0.0


def test_token_clipped_without_behaviour_is_on_policy_gradient() -> None:
    # mu := sg(pi) -> r = 1, loss = -(1*2 - 1*3) / 5 = 0.2, gradient -A/5 like REINFORCE
    inputs, logp = batch(behavior=False)
    out = TokenClippedSurrogateLoss()(inputs)
    assert out.loss.item() == pytest.approx(0.2, abs=TOL)
    out.loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0, -0.2, -0.2, 0], [0, 0.2, 0.2, 0.2]]), atol=TOL, rtol=0
    )
    assert out.metrics["clip_frac"] == 0.0


def test_cispo_clips_the_weight_not_the_token() -> None:
    # w = sg(clip(r, 0, 1.28)) = [[_, 1.28, .9, _], [_, .5, 1.1, 1]]; grad -w*A/5 on every token
    inputs, logp = batch()
    out = CISPOLoss(clip_eps_low=1.0, clip_eps_high=0.28)(inputs)
    lp = logp.detach().tolist()
    w = [[0, 1.28, 0.9, 0], [0, 0.5, 1.1, 1.0]]
    expected = (
        -(sum(w[0][t] * lp[0][t] for t in range(4)) - sum(w[1][t] * lp[1][t] for t in range(4))) / 5
    )
    assert out.loss.item() == pytest.approx(expected, abs=TOL)
    assert out.metrics["clip_frac"] == pytest.approx(1 / 5, abs=TOL)
    out.loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0, -1.28, -0.9, 0], [0, 0.5, 1.1, 1.0]]) / 5, atol=TOL, rtol=0
    )


def test_gspo_sequence_ratio_clip() -> None:
    # s_0 = exp(mean(ln1.5, ln.9)) = sqrt(1.35); s_1 = exp(mean(ln.5, ln1.1, 0)) = .55^(1/3)
    # eps (0.2, 0.1): row 0 (A=+1) s_0 = 1.1619 > 1.1 -> clipped to 1.1, zero grad
    #                 row 1 (A=-1) s_1 = 0.8193 in [0.8, 1.1] -> -s_1, unclipped
    # loss (seq mean) = -(1.1 - s_1) / 2; d/dlogp_1t = (1/2) * s_1 * (1/3)
    s1 = 0.55 ** (1 / 3)
    inputs, logp = batch()
    out = SequenceClippedSurrogateLoss(clip_eps_low=0.2, clip_eps_high=0.1)(inputs)
    assert out.loss.item() == pytest.approx(-(1.1 - s1) / 2, abs=TOL)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5, abs=TOL)  # row 0's 2 tokens
    assert out.metrics["ratio_mean"] == pytest.approx((math.sqrt(1.35) + s1) / 2, abs=TOL)
    out.loss.backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]]) * s1 / 6, atol=TOL, rtol=0
    )


def test_gmpo_geometric_mean_with_log_space_clip() -> None:
    # eps 0.4 in log space. Row 0 (A=+1): log r = [.405465, -.105361] -> min(lr, clamp(lr))
    #   = [0.4 (clipped), -.105361]; geo_0 = exp((0.4 - .105361) / 2); J_0 = geo_0
    # Row 1 (A=-2): log r = [-.693147, .095310, 0]; sgn = -1 picks max(lr, clamp(lr))
    #   = [-0.4 (clipped), .095310, 0]; geo_1 = exp((-0.4 + .095310) / 3); J_1 = -2 geo_1
    # loss = -(J_0 + J_1) / 2. Grad: row 0 t2: -geo_0/4; row 1 t2, t3: +2 geo_1 / 6; clipped 0.
    inputs, logp = batch(advantages=(1.0, -2.0))
    geo0 = math.exp((0.4 + math.log(0.9)) / 2)
    geo1 = math.exp((-0.4 + math.log(1.1)) / 3)
    out = GMPOLoss()(inputs)
    assert out.loss.item() == pytest.approx(-(geo0 - 2 * geo1) / 2, abs=TOL)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5, abs=TOL)
    out.loss.backward()
    expected = torch.tensor([[0, 0, -geo0 / 4, 0], [0, 0, geo1 / 3, geo1 / 3]])
    torch.testing.assert_close(logp.grad, expected.float(), atol=TOL, rtol=0)
    # wide clip: nothing clipped, geo_0 = sqrt(1.35), geo_1 = .55^(1/3)
    wide = GMPOLoss(clip_eps_low=2.0, clip_eps_high=2.0)(batch(advantages=(1.0, -2.0))[0])
    assert wide.loss.item() == pytest.approx(-(math.sqrt(1.35) - 2 * 0.55 ** (1 / 3)) / 2, abs=TOL)
    assert wide.metrics["clip_frac"] == 0.0


def test_masked_cross_entropy_equals_reinforce_with_unit_weight() -> None:
    # NLL = -(sum of logp over 5 action tokens) / 5
    inputs, logp = batch(advantages=(1.0, 1.0))
    lp = logp.detach()[torch.tensor(MASK, dtype=torch.bool)]
    out = MaskedCrossEntropyLoss()(inputs)
    assert out.loss.item() == pytest.approx(float(-lp.sum() / 5), abs=TOL)
    assert out.metrics["nll"] == pytest.approx(float(-lp.sum() / 5), abs=TOL)
    assert ReinforceLoss()(inputs).loss.item() == pytest.approx(out.loss.item(), abs=TOL)


@pytest.mark.parametrize(
    ("estimator", "per_token"),
    [
        ("k1", lambda d: -d),
        ("k2", lambda d: 0.5 * d * d),
        ("k3", lambda d: math.exp(d) - 1 - d),
    ],
)
def test_kl_to_reference_estimators(
    estimator: KLEstimator, per_token: Callable[[float], float]
) -> None:
    # d = ref - logp on each action token; loss = token mean of k(d)
    ref = [[0.0, -0.5, -2.0, 0.0], [0.0, -1.0, -1.0, -1.2]]
    inputs, logp = batch(ref=ref)
    lp = logp.detach().tolist()
    d = [ref[b][t] - lp[b][t] for b in range(2) for t in range(4) if MASK[b][t]]
    expected = sum(per_token(x) for x in d) / 5
    out = KLToReferenceLoss(estimator=estimator)(inputs)
    assert out.loss.item() == pytest.approx(expected, abs=TOL)
    assert out.metrics["kl_ref"] == pytest.approx(expected, abs=TOL)


def test_kl_k3_gradient() -> None:
    # k3 = exp(ref - logp) - 1 - (ref - logp); d/dlogp = 1 - exp(ref - logp), / 5 (token mean)
    ref = [[0.0, -0.5, -2.0, 0.0], [0.0, -1.0, -1.0, -1.2]]
    inputs, logp = batch(ref=ref)
    g = grad_of(KLToReferenceLoss(), inputs, logp)
    ref_t = torch.tensor(ref)
    expected = torch.where(
        torch.tensor(MASK, dtype=torch.bool), (1 - torch.exp(ref_t - logp.detach())) / 5, 0.0
    )
    torch.testing.assert_close(g, expected, atol=TOL, rtol=0)


def test_entropy_bonus() -> None:
    # loss = -(0.5 + 1.0 + 2.0 + 0.0 + 1.5) / 5 = -1.0 (masked entropies 99 are ignored)
    entropy = [[99.0, 0.5, 1.0, 99.0], [99.0, 2.0, 0.0, 1.5]]
    out = EntropyBonus()(batch(entropy=entropy)[0])
    assert out.loss.item() == pytest.approx(-1.0, abs=TOL)
    assert out.metrics["entropy"] == pytest.approx(1.0, abs=TOL)


def test_composite_sums_terms_and_prefixes_metrics() -> None:
    ref = [[0.0, -0.5, -2.0, 0.0], [0.0, -1.0, -1.0, -1.2]]
    entropy = [[0.0, 0.5, 1.0, 0.0], [0.0, 2.0, 0.0, 1.5]]
    pg, kl, ent = TokenClippedSurrogateLoss(clip_eps_high=0.28), KLToReferenceLoss(), EntropyBonus()
    composite = CompositeLoss(terms=[(1.0, pg), (0.04, kl), (0.01, ent)])
    assert composite.needs_ref_logprobs and composite.needs_entropy
    assert not pg.needs_ref_logprobs and not pg.needs_entropy
    inputs, _ = batch(ref=ref, entropy=entropy)
    out = composite(inputs)
    parts = [t(inputs).loss.item() for t in (pg, kl, ent)]
    assert out.loss.item() == pytest.approx(parts[0] + 0.04 * parts[1] + 0.01 * parts[2], abs=TOL)
    assert out.metrics["pg/loss"] == pytest.approx(0.144, abs=TOL)
    assert out.metrics["pg/clip_frac"] == pytest.approx(0.4, abs=TOL)
    assert out.metrics["kl_ref/kl_ref"] == pytest.approx(parts[1], abs=TOL)
    assert out.metrics["entropy/entropy"] == pytest.approx(1.0, abs=TOL)
    twice = CompositeLoss(terms=[(1.0, pg), (1.0, pg)])(inputs)
    assert "pg#2/loss" in twice.metrics
    with pytest.raises(ValueError, match="at least one"):
        CompositeLoss(terms=[])


def test_reduce_metrics_sums_additive_and_takes_extremes() -> None:
    merged = reduce_metrics(
        [
            {"clip_frac": 0.1, "ratio_min": 0.9, "ratio_max": 1.1},
            {"clip_frac": 0.2, "ratio_min": 0.7, "ratio_max": 1.0},
        ]
    )
    assert merged == pytest.approx({"clip_frac": 0.3, "ratio_min": 0.7, "ratio_max": 1.1})


def test_bad_inputs_and_configs_are_refused() -> None:
    inputs, _ = batch()
    with pytest.raises(ValueError, match="advantages_B"):
        ReinforceLoss()(
            LossInputs(
                logprobs_BT=inputs.logprobs_BT,
                action_mask_BT=inputs.action_mask_BT,
                advantages_B=torch.zeros(3),
                total_action_tokens=5.0,
                total_sequences=2.0,
            )
        )
    with pytest.raises(ValueError, match="behavior_logprobs_BT"):
        TokenClippedSurrogateLoss()(
            LossInputs(
                logprobs_BT=inputs.logprobs_BT,
                action_mask_BT=inputs.action_mask_BT,
                advantages_B=inputs.advantages_B,
                total_action_tokens=5.0,
                total_sequences=2.0,
                behavior_logprobs_BT=torch.zeros(2, 3),
            )
        )
    with pytest.raises(ValueError, match="total_action_tokens"):
        ReinforceLoss()(
            LossInputs(
                logprobs_BT=inputs.logprobs_BT,
                action_mask_BT=inputs.action_mask_BT,
                advantages_B=inputs.advantages_B,
                total_action_tokens=0.0,
                total_sequences=2.0,
            )
        )
    with pytest.raises(ValueError, match="ref_logprobs_BT"):
        KLToReferenceLoss()(inputs)
    with pytest.raises(ValueError, match="entropy_BT"):
        EntropyBonus()(inputs)
    with pytest.raises(ValueError, match="constant_normalizer"):
        TokenClippedSurrogateLoss(aggregation="constant")
    with pytest.raises(ValueError, match="aggregation"):
        ReinforceLoss(aggregation="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="estimator"):
        KLToReferenceLoss(estimator="k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        TokenClippedSurrogateLoss(clip_eps_low=1.5)


@pytest.mark.parametrize(
    "loss",
    [
        TokenClippedSurrogateLoss(),
        SequenceClippedSurrogateLoss(),
        GMPOLoss(),
        CISPOLoss(),
        ReinforceLoss(truncated_is_cap=2.0),
    ],
)
def test_absurd_behaviour_logprobs_cannot_overflow(loss: Loss) -> None:
    # behaviour logprob -1e4 on one token: log ratio ~ +1e4 is clamped to 20 before exp, so the
    # loss and every gradient stay finite.
    inputs, logp = batch()
    assert inputs.behavior_logprobs_BT is not None
    behavior = inputs.behavior_logprobs_BT.clone()
    behavior[1, 2] = -1e4
    extreme = LossInputs(
        logprobs_BT=logp,
        action_mask_BT=inputs.action_mask_BT,
        advantages_B=inputs.advantages_B,
        total_action_tokens=5.0,
        total_sequences=2.0,
        behavior_logprobs_BT=behavior,
    )
    g = grad_of(loss, extreme, logp)
    assert torch.isfinite(loss(extreme).loss)
    assert torch.isfinite(g).all()
