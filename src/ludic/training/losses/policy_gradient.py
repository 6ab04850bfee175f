"""Token-level policy-gradient losses: REINFORCE (optionally with truncated importance
sampling), the PPO/GRPO clipped surrogate with DAPO's asymmetric clip-higher, and CISPO.

Each class holds configuration; `__call__` is a pure function of `LossInputs`. None of them
adds a KL or entropy term (compose those with `CompositeLoss`).

Notation: r_t = exp(log pi(a_t) - log mu(a_t)) with mu the behaviour (sampling) policy, A the
sequence's advantage, and agg(.) the configured aggregation over action tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ludic.training.algorithm_types import Aggregation, LossInputs, LossOutput
from ludic.training.losses._common import corrected, policy_terms, token_ratio_metrics
from ludic.training.losses.aggregation import aggregate, check_aggregation, token_share


def _check_clip(low: float, high: float, owner: str, *, max_low: float = 1.0) -> None:
    if not (0.0 <= low <= max_low and high >= 0.0):
        raise ValueError(
            f"{owner}: clip epsilons must satisfy 0 <= eps_low <= {max_low} and eps_high >= 0, "
            f"got eps_low={low}, eps_high={high}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ReinforceLoss:
    """REINFORCE: loss = agg(-w_t * A * log pi(a_t)).

    w_t = 1, or with `truncated_is_cap=c` the truncated importance weight
    w_t = sg(min(r_t, c)) that corrects for the behaviour policy (needs behaviour logprobs).
    With A = 1 and token_mean this is the SFT negative log-likelihood.
    """

    name: ClassVar[str] = "reinforce"
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None
    truncated_is_cap: float | None = None

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation, self.constant_normalizer, "ReinforceLoss")
        if self.truncated_is_cap is not None and not self.truncated_is_cap > 0:
            raise ValueError(
                f"ReinforceLoss: truncated_is_cap must be > 0, got {self.truncated_is_cap}"
            )

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        terms = policy_terms(inputs)
        objective_BT = terms.advantages_B1 * terms.logprobs_BT
        metrics: dict[str, float] = {}
        if self.truncated_is_cap is not None:
            if inputs.behavior_logprobs_BT is None:
                raise ValueError(
                    "ReinforceLoss: truncated_is_cap is set but the batch has no behaviour "
                    "logprobs; collect rollouts with logprobs or leave truncated_is_cap=None"
                )
            ratio_BT = torch.exp(terms.log_ratio_BT.detach())
            weight_BT = ratio_BT.clamp(max=self.truncated_is_cap)
            objective_BT = weight_BT * objective_BT
            metrics = token_ratio_metrics(
                terms, ratio_BT > self.truncated_is_cap, inputs.total_action_tokens
            )
        loss = -aggregate(
            corrected(objective_BT, terms),
            terms.mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        return LossOutput(loss=loss, metrics=metrics)


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenClippedSurrogateLoss:
    """PPO / GRPO clipped surrogate per token, with DAPO's decoupled clip range:

        loss = agg(-min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A))

    eps_low = eps_high = 0.2 is PPO/GRPO; eps_high = 0.28 is DAPO's clip-higher. Without
    behaviour logprobs r_t = 1 (mu := sg(pi)), which is on-policy policy gradient.
    A token counts as clipped when the clipped branch is strictly smaller.

    `dual_clip=True` (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729) also bounds the loss of
    tokens with A < 0 by -c * A: loss_t = min(max(-r_t A, -clip(r_t) A), -c A) there, so a
    huge ratio on a bad token cannot dominate (c = `dual_clip_c` > 1, 3 as in the paper).
    """

    name: ClassVar[str] = "pg"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None
    dual_clip: bool = False
    dual_clip_c: float = 3.0

    def __post_init__(self) -> None:
        _check_clip(self.clip_eps_low, self.clip_eps_high, "TokenClippedSurrogateLoss")
        check_aggregation(self.aggregation, self.constant_normalizer, "TokenClippedSurrogateLoss")
        if not self.dual_clip_c > 1.0:
            raise ValueError(
                f"TokenClippedSurrogateLoss: dual_clip_c must be > 1 (3 in the paper), got "
                f"{self.dual_clip_c}"
            )

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        terms = policy_terms(inputs)
        ratio_BT = torch.exp(terms.log_ratio_BT)
        unclipped_BT = ratio_BT * terms.advantages_B1
        bounded_BT = ratio_BT.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)
        clipped_BT = bounded_BT * terms.advantages_B1
        objective_BT = torch.minimum(unclipped_BT, clipped_BT)
        metrics: dict[str, float] = {}
        if self.dual_clip:
            # objective = -loss, so the bound loss <= -c A is objective >= c A for A < 0.
            floor_BT = self.dual_clip_c * terms.advantages_B1
            negative_BT = (terms.advantages_B1 < 0).expand_as(objective_BT)
            dual_BT = negative_BT & (objective_BT.detach() < floor_BT.detach())
            objective_BT = torch.where(
                negative_BT, torch.maximum(objective_BT, floor_BT), objective_BT
            )
            metrics["dual_clip_frac"] = token_share(
                dual_BT.float(), terms.mask_BT, inputs.total_action_tokens
            )
        loss = -aggregate(
            corrected(objective_BT, terms),
            terms.mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        is_clipped_BT = clipped_BT.detach() < unclipped_BT.detach()
        metrics.update(token_ratio_metrics(terms, is_clipped_BT, inputs.total_action_tokens))
        return LossOutput(loss=loss, metrics=metrics)


@dataclass(frozen=True, kw_only=True, slots=True)
class CISPOLoss:
    """CISPO (MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the update.

        loss = agg(-sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * log pi(a_t))

    Every token keeps a gradient (no token is dropped by the clip). The paper sets no lower
    bound (eps_low = 1.0 here, so the weight stays >= 0) and tunes only eps_high (not
    published; 0.28 here). A token counts as clipped when its weight was changed by the clip.
    """

    name: ClassVar[str] = "cispo"
    clip_eps_low: float = 1.0
    clip_eps_high: float = 0.28
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        _check_clip(self.clip_eps_low, self.clip_eps_high, "CISPOLoss")
        check_aggregation(self.aggregation, self.constant_normalizer, "CISPOLoss")

    @property
    def needs_ref_logprobs(self) -> bool:
        return False

    @property
    def needs_entropy(self) -> bool:
        return False

    def __call__(self, inputs: LossInputs) -> LossOutput:
        terms = policy_terms(inputs)
        ratio_BT = torch.exp(terms.log_ratio_BT.detach())
        weight_BT = ratio_BT.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)
        loss = -aggregate(
            corrected(weight_BT * terms.advantages_B1 * terms.logprobs_BT, terms),
            terms.mask_BT,
            self.aggregation,
            total_action_tokens=inputs.total_action_tokens,
            total_sequences=inputs.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
        metrics = token_ratio_metrics(terms, weight_BT != ratio_BT, inputs.total_action_tokens)
        return LossOutput(loss=loss, metrics=metrics)
