"""Token-level policy-gradient losses: REINFORCE (optionally with truncated importance
sampling), the PPO/GRPO clipped surrogate with DAPO's asymmetric clip-higher, and CISPO.

Each class holds configuration and writes only its formula (`compute`); the checked inputs
come from `base.prepare`. None of them adds a KL or entropy term (compose those with
`CompositeLoss`).

Notation: r_t = exp(log pi(a_t) - log mu(a_t)) with mu the behaviour (sampling) policy, A the
sequence's advantage, and agg(.) the configured aggregation over action tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ludic.training.algorithm_types import LossOutput
from ludic.training.losses.aggregation import ratio_extremes
from ludic.training.losses.base import AggregatedLoss, LossBatch, check_clip
from ludic.training.option_warnings import warn_unread_option

_DUAL_CLIP_C = 3.0  # dual-clip PPO's c (Ye et al. 2020)


def token_ratio_metrics(batch: LossBatch, clipped_BT: torch.Tensor) -> dict[str, float]:
    """clip_frac, ratio_mean, approx_kl (k3 estimate of KL(mu || pi): r - 1 - log r) are
    additive shares over the batch's action tokens; ratio_min / ratio_max are this
    micro-batch's."""
    log_ratio_BT = batch.log_ratio_BT.detach()
    ratio_BT = torch.exp(log_ratio_BT)
    return {
        "clip_frac": batch.share(clipped_BT.float()),
        "ratio_mean": batch.share(ratio_BT),
        "approx_kl": batch.share(ratio_BT - 1.0 - log_ratio_BT),
        **ratio_extremes(ratio_BT, batch.mask_BT),
    }


@dataclass(frozen=True, kw_only=True, slots=True)
class ReinforceLoss(AggregatedLoss):
    """REINFORCE: loss = agg(-w_t * A * log pi(a_t)).

    w_t = 1, or with `truncated_is_cap=c` the truncated importance weight
    w_t = sg(min(r_t, c)) that corrects for the behaviour policy (needs behaviour logprobs).
    With A = 1 and token_mean this is the SFT negative log-likelihood.
    """

    name: ClassVar[str] = "reinforce"
    truncated_is_cap: float | None = None

    def _check_config(self) -> None:
        if self.truncated_is_cap is not None and not self.truncated_is_cap > 0:
            raise ValueError(
                f"ReinforceLoss: truncated_is_cap must be > 0, got {self.truncated_is_cap}"
            )

    def compute(self, batch: LossBatch) -> LossOutput:
        objective_BT = batch.advantages_B1 * batch.logprobs_BT
        metrics: dict[str, float] = {}
        if self.truncated_is_cap is not None:
            if not batch.has_behavior_logprobs:
                raise ValueError(
                    "ReinforceLoss: truncated_is_cap is set but the batch has no behaviour "
                    "logprobs; collect rollouts with logprobs or leave truncated_is_cap=None"
                )
            ratio_BT = torch.exp(batch.log_ratio_BT.detach())
            objective_BT = ratio_BT.clamp(max=self.truncated_is_cap) * objective_BT
            metrics = token_ratio_metrics(batch, ratio_BT > self.truncated_is_cap)
        loss = -self.reduce(batch.corrected(objective_BT), batch)
        return LossOutput(loss=loss, metrics=metrics)


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenClippedSurrogateLoss(AggregatedLoss):
    """PPO / GRPO clipped surrogate per token, with DAPO's decoupled clip range:

        loss = agg(-min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A))

    eps_low = eps_high = 0.2 is PPO/GRPO; eps_high = 0.28 is DAPO's clip-higher. Without
    behaviour logprobs r_t = 1 (mu := sg(pi)), which is on-policy policy gradient.
    A token counts as clipped when the clipped branch is strictly smaller.

    `dual_clip=True` (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729) also bounds the loss of
    tokens with A < 0 by -c * A: loss_t = min(max(-r_t A, -clip(r_t) A), -c A) there, so a
    huge ratio on a bad token cannot dominate (c = `dual_clip_c` > 1, 3 as in the paper).
    A `dual_clip_c` other than 3 without `dual_clip=True` is ignored with an
    `UnreadOptionWarning` (an ablation grid passes it to the arms without dual clip too).
    """

    name: ClassVar[str] = "pg"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    dual_clip: bool = False
    dual_clip_c: float = _DUAL_CLIP_C

    def _check_config(self) -> None:
        check_clip(self.clip_eps_low, self.clip_eps_high, "TokenClippedSurrogateLoss")
        if not self.dual_clip_c > 1.0:
            raise ValueError(
                f"TokenClippedSurrogateLoss: dual_clip_c must be > 1 (3 in the paper), got "
                f"{self.dual_clip_c}"
            )
        if not self.dual_clip and self.dual_clip_c != _DUAL_CLIP_C:
            warn_unread_option(
                "TokenClippedSurrogateLoss",
                "dual_clip_c",
                self.dual_clip_c,
                "it is read only with dual_clip=True",
            )

    def compute(self, batch: LossBatch) -> LossOutput:
        ratio_BT = torch.exp(batch.log_ratio_BT)
        unclipped_BT = ratio_BT * batch.advantages_B1
        bounded_BT = ratio_BT.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)
        clipped_BT = bounded_BT * batch.advantages_B1
        objective_BT = torch.minimum(unclipped_BT, clipped_BT)
        metrics: dict[str, float] = {}
        if self.dual_clip:
            objective_BT, metrics["dual_clip_frac"] = self._dual_clip(objective_BT, batch)
        loss = -self.reduce(batch.corrected(objective_BT), batch)
        is_clipped_BT = clipped_BT.detach() < unclipped_BT.detach()
        metrics.update(token_ratio_metrics(batch, is_clipped_BT))
        return LossOutput(loss=loss, metrics=metrics)

    def _dual_clip(
        self, objective_BT: torch.Tensor, batch: LossBatch
    ) -> tuple[torch.Tensor, float]:
        """The objective floored at c * A where A < 0, and the share of tokens floored."""
        # objective = -loss, so the bound loss <= -c A is objective >= c A for A < 0.
        floor_BT = self.dual_clip_c * batch.advantages_B1
        negative_BT = (batch.advantages_B1 < 0).expand_as(objective_BT)
        dual_BT = negative_BT & (objective_BT.detach() < floor_BT.detach())
        floored_BT = torch.where(negative_BT, torch.maximum(objective_BT, floor_BT), objective_BT)
        return floored_BT, batch.share(dual_BT.float())


@dataclass(frozen=True, kw_only=True, slots=True)
class CISPOLoss(AggregatedLoss):
    """CISPO (MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the update.

        loss = agg(-sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A * log pi(a_t))

    Every token keeps a gradient (no token is dropped by the clip). The paper sets no lower
    bound (eps_low = 1.0 here, so the weight stays >= 0) and tunes only eps_high (not
    published; 0.28 here). A token counts as clipped when its weight was changed by the clip.
    """

    name: ClassVar[str] = "cispo"
    clip_eps_low: float = 1.0
    clip_eps_high: float = 0.28

    def _check_config(self) -> None:
        check_clip(self.clip_eps_low, self.clip_eps_high, "CISPOLoss")

    def compute(self, batch: LossBatch) -> LossOutput:
        ratio_BT = torch.exp(batch.log_ratio_BT.detach())
        weight_BT = ratio_BT.clamp(1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high)
        objective_BT = weight_BT * batch.advantages_B1 * batch.logprobs_BT
        loss = -self.reduce(batch.corrected(objective_BT), batch)
        return LossOutput(loss=loss, metrics=token_ratio_metrics(batch, weight_BT != ratio_BT))
