"""What every loss of the family receives and shares: `prepare` checks a micro-batch's
`LossInputs` once and turns it into a `LossBatch` (boolean action mask, masked float32
logprobs, the clamped log importance ratio, detached advantages); `AggregatedLoss` holds the
configuration every loss shares (aggregation mode, Dr.GRPO normaliser) and calls `compute`,
which is the only thing a loss module writes. No formula lives here.

Shape legend: B = sequences in the micro-batch, T = padded tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ludic.training.algorithm_types import Aggregation, LossInputs, LossOutput
from ludic.training.losses.aggregation import aggregate, check_aggregation, masked, token_share

# |log pi - log mu| is clamped here before any exp: e^20 ~ 5e8 is already meaningless as a ratio,
# and a stale or mismatched behaviour logprob (say -1e4) must not overflow to inf and turn the
# backward pass into nan (0 * inf). Tokens beyond the limit get no gradient through the ratio.
LOG_RATIO_LIMIT = 20.0

_SAME_SHAPE = (
    "action_mask_BT",
    "behavior_logprobs_BT",
    "ref_logprobs_BT",
    "entropy_BT",
    "is_weights_BT",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class LossBatch:
    """A checked micro-batch, as every loss formula reads it. Masked slots hold exact zeros.

    `logprobs_BT` (log pi, float32) and `entropy_BT` carry the policy's gradient;
    `log_ratio_BT` = log pi(a) - log mu(a) clamped to +-LOG_RATIO_LIMIT, with mu := sg(pi)
    when the batch has no behaviour logprobs (ratio 1 carrying pi's gradient);
    `ref_logprobs_BT`, `advantages_B1` and `is_weights_BT` (rollout-correction weights, None
    meaning 1) are detached. Totals count the whole optimizer batch.
    """

    mask_BT: torch.Tensor
    logprobs_BT: torch.Tensor
    log_ratio_BT: torch.Tensor
    advantages_B1: torch.Tensor
    has_behavior_logprobs: bool
    total_action_tokens: float
    total_sequences: float
    ref_logprobs_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None
    is_weights_BT: torch.Tensor | None = None

    def corrected(self, values_BT: torch.Tensor) -> torch.Tensor:
        """Per-token policy terms times the rollout-correction weights (unchanged without)."""
        return values_BT if self.is_weights_BT is None else values_BT * self.is_weights_BT

    def share(self, values_BT: torch.Tensor) -> float:
        """Additive metric: sum over this micro-batch's action tokens / the batch's count."""
        return token_share(values_BT, self.mask_BT, self.total_action_tokens)


def check_inputs(inputs: LossInputs) -> None:
    """Refuse tensors whose shapes disagree and batch totals that are not positive."""
    shape = inputs.logprobs_BT.shape
    if inputs.logprobs_BT.dim() != 2:
        raise ValueError(f"LossInputs.logprobs_BT must be [B, T], got shape {tuple(shape)}")
    for name in _SAME_SHAPE:
        t = getattr(inputs, name)
        if t is not None and t.shape != shape:
            raise ValueError(
                f"LossInputs.{name} has shape {tuple(t.shape)}; it must match logprobs_BT "
                f"{tuple(shape)}"
            )
    if inputs.advantages_B.shape != shape[:1]:
        raise ValueError(
            f"LossInputs.advantages_B has shape {tuple(inputs.advantages_B.shape)}; expected "
            f"({shape[0]},), one weight per sequence"
        )
    if not (inputs.total_action_tokens > 0 and inputs.total_sequences > 0):
        raise ValueError(
            "LossInputs: total_action_tokens and total_sequences must count the whole optimizer "
            f"batch and be > 0, got {inputs.total_action_tokens} and {inputs.total_sequences}; "
            "skip batches without action tokens before calling the loss"
        )


def _masked_float(values_BT: torch.Tensor | None, mask_BT: torch.Tensor) -> torch.Tensor | None:
    return None if values_BT is None else masked(values_BT.float(), mask_BT)


def prepare(inputs: LossInputs) -> LossBatch:
    """Check `inputs` (see `check_inputs`) and build the `LossBatch` every formula reads."""
    check_inputs(inputs)
    mask_BT = inputs.action_mask_BT > 0
    logprobs_BT = masked(inputs.logprobs_BT.float(), mask_BT)
    if inputs.behavior_logprobs_BT is None:
        behavior_BT = logprobs_BT.detach()
    else:
        behavior_BT = masked(inputs.behavior_logprobs_BT.detach().float(), mask_BT)
    ref_BT = inputs.ref_logprobs_BT
    return LossBatch(
        mask_BT=mask_BT,
        logprobs_BT=logprobs_BT,
        log_ratio_BT=(logprobs_BT - behavior_BT).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT),
        advantages_B1=inputs.advantages_B.detach().float().unsqueeze(-1),
        has_behavior_logprobs=inputs.behavior_logprobs_BT is not None,
        total_action_tokens=inputs.total_action_tokens,
        total_sequences=inputs.total_sequences,
        ref_logprobs_BT=_masked_float(None if ref_BT is None else ref_BT.detach(), mask_BT),
        entropy_BT=_masked_float(inputs.entropy_BT, mask_BT),
        is_weights_BT=(
            None if inputs.is_weights_BT is None else inputs.is_weights_BT.detach().float()
        ),
    )


def check_clip(low: float, high: float, owner: str, *, max_low: float | None = 1.0) -> None:
    """Refuse clip epsilons outside 0 <= low (<= max_low unless None) and high >= 0."""
    low_ok = low >= 0.0 and (max_low is None or low <= max_low)
    if not (low_ok and high >= 0.0):
        bound = "0 <= eps_low" if max_low is None else f"0 <= eps_low <= {max_low}"
        raise ValueError(
            f"{owner}: clip epsilons must satisfy {bound} and eps_high >= 0, "
            f"got eps_low={low}, eps_high={high}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class AggregatedLoss:
    """A loss whose per-token terms become a scalar by one aggregation mode (see `aggregate`).

    A subclass sets `name`, declares `needs_ref_logprobs` / `needs_entropy` (the Trainer
    computes those inputs only when asked, and `__call__` refuses a batch without them), may
    refuse bad settings in `_check_config`, and writes its formula in `compute`.
    """

    name: ClassVar[str]
    needs_ref_logprobs: ClassVar[bool] = False
    needs_entropy: ClassVar[bool] = False
    aggregation: Aggregation = "token_mean"
    constant_normalizer: float | None = None

    def __post_init__(self) -> None:
        check_aggregation(self.aggregation, self.constant_normalizer, type(self).__name__)
        self._check_config()

    def _check_config(self) -> None:
        """Refuse a subclass's bad settings (nothing to refuse here)."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        batch = prepare(inputs)
        owner = type(self).__name__
        if self.needs_ref_logprobs and batch.ref_logprobs_BT is None:
            raise ValueError(
                f"{owner} needs LossInputs.ref_logprobs_BT; give the Trainer a reference "
                "model (it computes them when loss.needs_ref_logprobs is True)"
            )
        if self.needs_entropy and batch.entropy_BT is None:
            raise ValueError(
                f"{owner} needs LossInputs.entropy_BT; the Trainer computes it when "
                "loss.needs_entropy is True"
            )
        return self.compute(batch)

    def compute(self, batch: LossBatch) -> LossOutput:
        """The loss on a checked batch: the formula, and nothing else."""
        raise NotImplementedError(f"{type(self).__name__} must define compute(batch)")

    def reduce(self, values_BT: torch.Tensor, batch: LossBatch) -> torch.Tensor:
        """This micro-batch's share of the aggregate of per-token `values_BT`."""
        return aggregate(
            values_BT,
            batch.mask_BT,
            self.aggregation,
            total_action_tokens=batch.total_action_tokens,
            total_sequences=batch.total_sequences,
            constant_normalizer=self.constant_normalizer,
        )
