"""Algorithm presets: each is a credit assigner plus a loss, with the paper's defaults.

A preset is a plain function returning `RLAlgorithm`; to change anything beyond its arguments,
build `RLAlgorithm(name=..., credit_assigner=..., loss=...)` yourself. No preset needs a critic;
KL-to-reference and entropy terms are added only when their coefficient is non-zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ludic.training.algorithm_types import Aggregation, Loss, RLAlgorithm
from ludic.training.credit import (
    AWRCredit,
    ConstantCredit,
    GiGPO,
    GroupNormalizedReturn,
    LeaveOneOutReturn,
    MonteCarloReturn,
    ReinforcePlusPlus,
)
from ludic.training.credit.awr import AWRBaseline, TurnPredicate, warn_unread_baseline_options
from ludic.training.credit.core import AnchorKeyFn, default_anchor_key
from ludic.training.credit.gigpo import Combine, EpisodeStat
from ludic.training.credit.value import Featurizer, ValueFitter
from ludic.training.losses import (
    CISPOLoss,
    CompositeLoss,
    EntropyBonus,
    GMPOLoss,
    KLEstimator,
    KLToReferenceLoss,
    MaskedCrossEntropyLoss,
    ReinforceLoss,
    RolloutCorrection,
    SequenceClippedSurrogateLoss,
    TokenClippedSurrogateLoss,
)
from ludic.training.losses.regularizers import check_kl_options
from ludic.training.losses.rollout_correction import Correction
from ludic.training.option_warnings import warn_unread_option


def with_regularizers(
    loss: Loss,
    *,
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    entropy_coef: float = 0.0,
    aggregation: Aggregation = "token_mean",
    constant_normalizer: float | None = None,
    kl_clamp: float | None = None,
) -> Loss:
    """`loss + kl_beta * KL(pi || pi_ref) - entropy_coef * H`, or `loss` unchanged when both
    coefficients are 0. The extra terms use the same aggregation as the policy term.
    With kl_beta=0, a `kl_clamp` or a `kl_estimator` other than k3 is ignored with an
    `UnreadOptionWarning` (an ablation grid's kl_beta=0 arm); an invalid one still raises."""
    return _regularized(
        loss,
        owner="with_regularizers",
        estimator_default="k3",
        kl_beta=kl_beta,
        kl_estimator=kl_estimator,
        entropy_coef=entropy_coef,
        aggregation=aggregation,
        constant_normalizer=constant_normalizer,
        kl_clamp=kl_clamp,
    )


def _regularized(
    loss: Loss,
    *,
    owner: str,
    estimator_default: KLEstimator,
    kl_beta: float,
    kl_estimator: KLEstimator,
    kl_clamp: float | None,
    aggregation: Aggregation,
    entropy_coef: float = 0.0,
    constant_normalizer: float | None = None,
) -> Loss:
    """`with_regularizers` for `owner`, whose own KL estimator default is `estimator_default`
    (a preset's default is not a knob the user set, so it draws no warning)."""
    if kl_beta < 0 or entropy_coef < 0:
        raise ValueError(f"kl_beta and entropy_coef must be >= 0, got {kl_beta}, {entropy_coef}")
    check_kl_options(kl_estimator, kl_clamp, owner)
    if kl_beta == 0:
        _warn_unread_kl_options(owner, kl_estimator, estimator_default, kl_clamp)
    terms: list[tuple[float, Loss]] = [(1.0, loss)]
    if kl_beta > 0:
        kl = KLToReferenceLoss(
            estimator=kl_estimator,
            clamp=kl_clamp,
            aggregation=aggregation,
            constant_normalizer=constant_normalizer,
        )
        terms.append((kl_beta, kl))
    if entropy_coef > 0:
        bonus = EntropyBonus(aggregation=aggregation, constant_normalizer=constant_normalizer)
        terms.append((entropy_coef, bonus))
    return loss if len(terms) == 1 else CompositeLoss(terms=terms)


def _warn_unread_kl_options(
    owner: str, kl_estimator: str, estimator_default: str, kl_clamp: float | None
) -> None:
    """kl_beta=0 leaves the KL term out: name each KL knob the user set, which nothing reads."""
    why = "kl_beta=0 leaves the KL-to-reference term out (pass kl_beta > 0, e.g. 0.04, to use it)"
    if kl_clamp is not None:
        warn_unread_option(owner, "kl_clamp", kl_clamp, why)
    if kl_estimator != estimator_default:
        warn_unread_option(owner, "kl_estimator", kl_estimator, why)


def with_rollout_correction(algorithm: RLAlgorithm, *corrections: Correction) -> RLAlgorithm:
    """`algorithm` with rollout importance-sampling correction of its loss, e.g.
    `with_rollout_correction(make_grpo(), TruncatedIS(cap=2.0), RejectOutside(level="sequence",
    low=0.1, high=10.0))`; see `losses.rollout_correction` for the formula. Turn it on when
    the mismatch metrics (`mismatch/...`) or the policy lag histogram are not near zero."""
    return dataclasses.replace(
        algorithm, loss=RolloutCorrection(loss=algorithm.loss, corrections=corrections)
    )


def make_reinforce(
    *,
    gamma: float = 1.0,
    aggregation: Aggregation = "seq_mean_token_sum",
    truncated_is_cap: float | None = None,
) -> RLAlgorithm:
    """REINFORCE (Williams 1992): A_k = discounted return-to-go, loss = -A * log pi(turn).

    seq_mean_token_sum keeps the textbook estimator E[G grad log pi(o)] with log pi(o) the sum
    over the turn's tokens; pass "token_mean" for a length-normalised variant.
    `truncated_is_cap` adds a truncated importance weight against the behaviour policy.
    """
    return RLAlgorithm(
        name="reinforce",
        credit_assigner=MonteCarloReturn(gamma=gamma),
        loss=ReinforceLoss(aggregation=aggregation, truncated_is_cap=truncated_is_cap),
    )


def make_reinforce_baseline(
    *,
    aggregation: Aggregation = "seq_mean_token_sum",
    truncated_is_cap: float | None = None,
) -> RLAlgorithm:
    """REINFORCE with the group-mean baseline: A_i = R_i - mean_group(R) for every turn of
    episode i (groups by `meta["group_id"]`), no std scaling."""
    return RLAlgorithm(
        name="reinforce_baseline",
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        loss=ReinforceLoss(aggregation=aggregation, truncated_is_cap=truncated_is_cap),
    )


def make_grpo(
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    aggregation: Aggregation = "seq_mean_token_mean",
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    entropy_coef: float = 0.0,
    dual_clip: bool = False,
    dual_clip_c: float = 3.0,
    kl_clamp: float | None = None,
    split_over_turns: bool = False,
) -> RLAlgorithm:
    """GRPO (DeepSeekMath, arXiv:2402.03300): A_i = (R_i - mean) / (std + eps) in the group,
    token-clipped surrogate with eps = 0.2, aggregated as the paper writes it,
    (1/G) sum_i (1/|o_i|) sum_t (seq_mean_token_mean). The paper adds a k3 KL penalty with
    beta = 0.04 (pass kl_beta=0.04; it needs a reference model); the default here has none.
    DAPO (arXiv:2503.14476) is clip_eps_high=0.28 with aggregation="token_mean".
    `dual_clip=True` bounds the loss of negative-advantage tokens by -c * A (dual-clip PPO);
    `kl_clamp` caps a k3 / k3+ estimate (verl's low_var_kl uses 10).
    `split_over_turns=True` gives each of a k-turn episode's turn samples A_i / k, so every
    episode weighs once in the loss whatever its turn count (see `GroupNormalizedReturn`).
    """
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        aggregation=aggregation,
        dual_clip=dual_clip,
        dual_clip_c=dual_clip_c,
    )
    return RLAlgorithm(
        name="grpo",
        credit_assigner=GroupNormalizedReturn(
            normalize_std=True, split_over_turns=split_over_turns
        ),
        loss=_regularized(
            loss,
            owner="make_grpo",
            estimator_default="k3",
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
            kl_clamp=kl_clamp,
            entropy_coef=entropy_coef,
            aggregation=aggregation,
        ),
    )


def make_dr_grpo(
    *,
    max_tokens: int,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> RLAlgorithm:
    """Dr.GRPO ("GRPO done right", arXiv:2503.20783): removes GRPO's two biases. Advantages
    are R_i - mean (no std division) and the loss is sum over tokens / (N * max_tokens), a
    constant normaliser, so long wrong answers are not favoured. `max_tokens` is the
    generation budget per sample."""
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        aggregation="constant",
        constant_normalizer=float(max_tokens),
    )
    return RLAlgorithm(
        name="dr_grpo",
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        loss=loss,
    )


def make_gspo(
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
) -> RLAlgorithm:
    """GSPO (arXiv:2507.18071): GRPO's group-normalised advantages with a clipped
    sequence-level ratio exp(mean_t log r_t), clip range (3e-4, 4e-4) as in the paper,
    averaged over sequences."""
    return RLAlgorithm(
        name="gspo",
        credit_assigner=GroupNormalizedReturn(normalize_std=True),
        loss=SequenceClippedSurrogateLoss(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high),
    )


def make_cispo(
    *,
    clip_eps_low: float = 1.0,
    clip_eps_high: float = 0.28,
) -> RLAlgorithm:
    """CISPO (MiniMax-M1, arXiv:2506.13585): GRPO's group-normalised advantages, and the loss
    -sg(clip(r_t)) * A * log pi(a_t) averaged over all tokens of the batch (token_mean). No
    lower bound on the weight (eps_low = 1), eps_high tuned (the paper gives no value)."""
    return RLAlgorithm(
        name="cispo",
        credit_assigner=GroupNormalizedReturn(normalize_std=True),
        loss=CISPOLoss(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high),
    )


def make_gmpo(
    *,
    clip_eps_low: float = 0.4,
    clip_eps_high: float = 0.4,
) -> RLAlgorithm:
    """GMPO (arXiv:2507.20673): GRPO's credit with the geometric mean of token ratios,
    clipped per token in log space to (e^-0.4, e^0.4), averaged over sequences."""
    return RLAlgorithm(
        name="gmpo",
        credit_assigner=GroupNormalizedReturn(normalize_std=True),
        loss=GMPOLoss(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high),
    )


def make_sft(*, aggregation: Aggregation = "token_mean") -> RLAlgorithm:
    """SFT as offline RL: every turn weighs 1.0 and the loss is the NLL of action tokens,
    which equals REINFORCE with A = 1 (`ReinforceLoss`) under the same aggregation."""
    return RLAlgorithm(
        name="sft",
        credit_assigner=ConstantCredit(value=1.0),
        loss=MaskedCrossEntropyLoss(aggregation=aggregation),
    )


def make_rloo(
    *,
    aggregation: Aggregation = "seq_mean_token_sum",
    truncated_is_cap: float | None = None,
) -> RLAlgorithm:
    """RLOO (arXiv:2402.14740): A_i = R_i - mean_{j != i} R_j over the other episodes of the
    group (`LeaveOneOutReturn`), REINFORCE loss on the whole turn (sum over its tokens)."""
    return RLAlgorithm(
        name="rloo",
        credit_assigner=LeaveOneOutReturn(),
        loss=ReinforceLoss(aggregation=aggregation, truncated_is_cap=truncated_is_cap),
    )


def make_reinforce_pp(
    *,
    group_baseline: bool = False,
    gamma: float = 1.0,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    aggregation: Aggregation = "token_mean",
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k2",
    kl_clamp: float | None = None,
) -> RLAlgorithm:
    """REINFORCE++ (arXiv:2501.03262): batch-whitened returns-to-go (`ReinforcePlusPlus`), or
    with `group_baseline=True` REINFORCE++-baseline, whiten(R_i - mean_group R); PPO's token
    clip, token_mean. The paper folds a k1 KL into the reward; here KL is a loss term
    (kl_beta, with k2 as verl's REINFORCE++ recipes use; `kl_clamp` caps a k3 / k3+ estimate)."""
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, aggregation=aggregation
    )
    return RLAlgorithm(
        name="reinforce_pp_baseline" if group_baseline else "reinforce_pp",
        credit_assigner=ReinforcePlusPlus(group_baseline=group_baseline, gamma=gamma),
        loss=_regularized(
            loss,
            owner="make_reinforce_pp",
            estimator_default="k2",
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
            kl_clamp=kl_clamp,
            aggregation=aggregation,
        ),
    )


def make_awr(
    *,
    beta: float = 1.0,
    max_weight: float = 20.0,
    baseline: AWRBaseline = "group",
    normalize_std: bool = False,
    gamma: float = 1.0,
    aggregation: Aggregation = "token_mean",
    state_prior: float | None = None,
    state_normalize: bool = False,
    trained: TurnPredicate | None = None,
    value_folds: int | None = None,
    value_seed: int | None = None,
    featurize: Featurizer | None = None,
    featurize_action: Featurizer | None = None,
    fit_value: ValueFitter | None = None,
    normalize_mean: bool = False,
    min_weight: float = 0.0,
) -> RLAlgorithm:
    """AWR (arXiv:1910.00177) for offline rollouts: every turn's log-likelihood
    weighted by w = min(exp(A / beta), max_weight) (`AWRCredit`; A from the group mean, the
    mean return of the data with baseline="mean", or the mean return-to-go of the other
    visits of the turn's state with baseline="state", Q - V by counting with "state_action",
    or a learned value with baseline="value": `fit_value` over `featurize`d turns, cross-fitted
    over `value_folds` folds of rollouts, or learned Q - V with baseline="q_value", Q over
    `featurize_action`d turns). The loss is -w * log pi (REINFORCE on the
    weights), i.e. weighted SFT; with every A = 0 it is SFT. `state_normalize` divides each
    weight by its state's mean weight over the `trained` turns, `normalize_mean` by the mean
    over all `trained` turns, and `min_weight` floors the weights (see `AWRCredit`).
    The options only some baselines read (`BASELINE_OPTIONS`: `state_prior` by "state" and
    "state_action"; `value_folds`, `value_seed`, `featurize` and `fit_value` by "value" and
    "q_value"; `featurize_action` by "q_value") take `AWRCredit`'s defaults when None, and one
    given with a baseline that does not read it is named by an `UnreadOptionWarning` (with the
    baselines that read it): a grid over baselines builds every arm, and no knob is ignored in
    silence. A value no baseline could use (`value_folds=1`, `state_prior <= 0`) raises."""
    options = {
        "state_prior": state_prior,
        "value_folds": value_folds,
        "value_seed": value_seed,
        "featurize": featurize,
        "featurize_action": featurize_action,
        "fit_value": fit_value,
    }
    # options of several types, left to AWRCredit's checks; None: not given (its default)
    given: dict[str, Any] = {name: value for name, value in options.items() if value is not None}
    credit = AWRCredit(
        beta=beta,
        max_weight=max_weight,
        baseline=baseline,
        normalize_std=normalize_std,
        gamma=gamma,
        state_normalize=state_normalize,
        trained=trained,
        normalize_mean=normalize_mean,
        min_weight=min_weight,
        **given,
    )
    warn_unread_baseline_options(baseline, given)
    return RLAlgorithm(
        name="awr", credit_assigner=credit, loss=ReinforceLoss(aggregation=aggregation)
    )


def make_gigpo(
    *,
    gamma: float = 0.95,
    omega: float | None = None,
    combine: Combine = "paper",
    normalize_std: bool = True,
    step_normalize_std: bool = True,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    aggregation: Aggregation = "token_mean",
    kl_beta: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_clamp: float | None = None,
    default_step_reward: float = 0.0,
    episode_stat: EpisodeStat = "trajectory",
    anchor_key: AnchorKeyFn = default_anchor_key,
) -> RLAlgorithm:
    """GiGPO (arXiv:2505.10978): A = A_E + omega * A_S (episode-level group advantage plus
    step-level advantage over anchor states, gamma = 0.95, omega = 1 as in the paper; see
    `GiGPO` for combine="seed003", `default_step_reward`, final scores and `episode_stat`),
    with the token-clipped surrogate (token_mean, as the reference verl-agent code runs it).
    The paper uses a KL penalty beta = 0.01 (kl_beta; `kl_clamp` caps a k3 / k3+ estimate).
    `anchor_key` maps a turn to its anchor
    state (default: the env's state key, else the observation text's hash)."""
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, aggregation=aggregation
    )
    credit = GiGPO(
        gamma=gamma,
        omega=omega,
        combine=combine,
        normalize_std=normalize_std,
        step_normalize_std=step_normalize_std,
        default_step_reward=default_step_reward,
        episode_stat=episode_stat,
        anchor_key=anchor_key,
    )
    return RLAlgorithm(
        name="gigpo",
        credit_assigner=credit,
        loss=_regularized(
            loss,
            owner="make_gigpo",
            estimator_default="k3",
            kl_beta=kl_beta,
            kl_estimator=kl_estimator,
            kl_clamp=kl_clamp,
            aggregation=aggregation,
        ),
    )


__all__ = [
    "make_awr",
    "make_cispo",
    "make_dr_grpo",
    "make_gigpo",
    "make_gmpo",
    "make_grpo",
    "make_gspo",
    "make_reinforce",
    "make_reinforce_baseline",
    "make_reinforce_pp",
    "make_rloo",
    "make_sft",
    "with_regularizers",
    "with_rollout_correction",
]
