"""Presets: each pairs the documented credit assigner with the documented loss, and runs end to
end from rollouts to a loss whose descent direction favours the better episodes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ludic.rollouts.samples import CreditAssigner
from ludic.training.algorithm import (
    make_cispo,
    make_dr_grpo,
    make_gigpo,
    make_gmpo,
    make_grpo,
    make_gspo,
    make_reinforce,
    make_reinforce_baseline,
    make_sft,
    with_regularizers,
)
from ludic.training.algorithm_types import Loss, LossInputs, RLAlgorithm
from ludic.training.credit import (
    ConstantCredit,
    GiGPO,
    GroupNormalizedReturn,
    MonteCarloReturn,
)
from ludic.training.losses import (
    CISPOLoss,
    CompositeLoss,
    GMPOLoss,
    KLToReferenceLoss,
    MaskedCrossEntropyLoss,
    ReinforceLoss,
    SequenceClippedSurrogateLoss,
    TokenClippedSurrogateLoss,
)
from ludic.types import AgentStep, EnvironmentStep, Rollout

PRESETS: dict[str, Callable[[], RLAlgorithm]] = {
    "reinforce": make_reinforce,
    "reinforce_baseline": make_reinforce_baseline,
    "grpo": make_grpo,
    "dr_grpo": lambda: make_dr_grpo(max_tokens=16),
    "gspo": make_gspo,
    "cispo": make_cispo,
    "gmpo": make_gmpo,
    "sft": make_sft,
    "gigpo": make_gigpo,
}


def test_presets_pair_the_documented_credit_and_loss() -> None:
    algos = {name: make() for name, make in PRESETS.items()}
    for name, algo in algos.items():
        assert algo.name == name
        assert isinstance(algo.credit_assigner, CreditAssigner)
        assert isinstance(algo.loss, Loss)
        assert not algo.loss.needs_ref_logprobs and not algo.loss.needs_entropy

    assert algos["reinforce"].credit_assigner == MonteCarloReturn(gamma=1.0)
    assert algos["reinforce"].loss == ReinforceLoss(aggregation="seq_mean_token_sum")
    assert algos["reinforce_baseline"].credit_assigner == GroupNormalizedReturn(normalize_std=False)
    assert algos["grpo"].credit_assigner == GroupNormalizedReturn(normalize_std=True)
    assert algos["grpo"].loss == TokenClippedSurrogateLoss(
        clip_eps_low=0.2, clip_eps_high=0.2, aggregation="seq_mean_token_mean"
    )
    assert algos["dr_grpo"].credit_assigner == GroupNormalizedReturn(normalize_std=False)
    assert algos["dr_grpo"].loss == TokenClippedSurrogateLoss(
        aggregation="constant", constant_normalizer=16.0
    )
    assert algos["gspo"].loss == SequenceClippedSurrogateLoss(
        clip_eps_low=3e-4, clip_eps_high=4e-4, aggregation="seq_mean_token_mean"
    )
    assert algos["cispo"].loss == CISPOLoss(aggregation="token_mean")
    assert algos["gmpo"].loss == GMPOLoss(clip_eps_low=0.4, clip_eps_high=0.4)
    assert algos["sft"].credit_assigner == ConstantCredit(value=1.0)
    assert algos["sft"].loss == MaskedCrossEntropyLoss(aggregation="token_mean")
    gigpo = algos["gigpo"].credit_assigner
    assert isinstance(gigpo, GiGPO)
    assert (gigpo.gamma, gigpo.effective_omega, gigpo.combine) == (0.95, 1.0, "paper")


def test_regularizers_are_added_only_when_asked() -> None:
    grpo = make_grpo(kl_beta=0.04, entropy_coef=0.01)
    assert isinstance(grpo.loss, CompositeLoss)
    assert grpo.loss.needs_ref_logprobs and grpo.loss.needs_entropy
    coefs = [coef for coef, _ in grpo.loss.terms]
    assert coefs == [1.0, 0.04, 0.01]
    kl = grpo.loss.terms[1][1]
    assert kl == KLToReferenceLoss(estimator="k3", aggregation="seq_mean_token_mean")
    gigpo = make_gigpo(kl_beta=0.01, combine="seed003")
    assert gigpo.loss.needs_ref_logprobs
    base = TokenClippedSurrogateLoss()
    assert with_regularizers(base) is base
    with pytest.raises(ValueError, match="kl_beta"):
        with_regularizers(base, kl_beta=-1.0)


def episode(rid: str, rewards: list[float], group: str) -> Rollout:
    steps: list[AgentStep | EnvironmentStep] = []
    for k, r in enumerate(rewards):
        a = AgentStep(
            index=2 * k, turn_id=f"t{k}", info={"observation": f"s{k}", "state_key": f"s{k}"}
        )
        steps += [
            a,
            EnvironmentStep(index=2 * k + 1, turn_id=f"t{k}", reward=r, agent_step_ids=(a.id,)),
        ]
    return Rollout(id=rid, steps=steps, meta={"group_id": group})


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_end_to_end_descent_favours_better_episodes(name: str) -> None:
    # Two 2-turn episodes in one group: "win" (rewards 0, 1) and "lose" (0, -1). One sample per
    # turn (4 sequences of 3 action tokens), on-policy (behaviour = current logprobs).
    algo = PRESETS[name]()
    weights = algo.credit_assigner.assign(
        [episode("win", [0.0, 1.0], "g"), episode("lose", [0.0, -1.0], "g")]
    )
    keys = [("win", "t0"), ("win", "t1"), ("lose", "t0"), ("lose", "t1")]
    advantages_B = torch.tensor([weights[k] for k in keys])
    logp = torch.full((4, 4), -1.0, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 1]] * 4, dtype=torch.float32)
    out = algo.loss(
        LossInputs(
            logprobs_BT=logp,
            action_mask_BT=mask,
            advantages_B=advantages_B,
            total_action_tokens=12.0,
            total_sequences=4.0,
            behavior_logprobs_BT=(logp.detach() * mask),
        )
    )
    out.loss.backward()
    assert logp.grad is not None and torch.isfinite(out.loss)
    step_direction_B = -logp.grad.sum(dim=-1)  # how gradient descent moves each sample's logp
    if name == "sft":
        assert (step_direction_B > 0).all()
        return
    # the winning episode's final turn is pushed up, the losing one's down
    assert step_direction_B[1] > 0 > step_direction_B[3]
    assert torch.all(logp.grad[:, 0] == 0.0)


def test_sft_equals_reinforce_with_unit_credit() -> None:
    sft = make_sft()
    weights = sft.credit_assigner.assign([episode("a", [0.3, -2.0], "g")])
    assert set(weights.values()) == {1.0}
    logp = torch.tensor([[0.0, -0.5, -1.5], [0.0, -2.0, -0.25]])
    inputs = LossInputs(
        logprobs_BT=logp,
        action_mask_BT=torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]),
        advantages_B=torch.tensor([weights[("a", "t0")], weights[("a", "t1")]]),
        total_action_tokens=4.0,
        total_sequences=2.0,
    )
    # NLL = (0.5 + 1.5 + 2.0 + 0.25) / 4 = 1.0625
    assert sft.loss(inputs).loss.item() == pytest.approx(1.0625, abs=1e-6)
    assert ReinforceLoss()(inputs).loss.item() == pytest.approx(1.0625, abs=1e-6)
