"""The loss family: policy-gradient, sequence-ratio and regulariser terms, all aggregated by one
batch-normalised contract (`aggregate`) so micro-batch losses sum to the big-batch loss.

Every loss receives the same thing: `base.prepare` checks the Trainer's `LossInputs` once and
hands the formula a `LossBatch`; a loss subclasses `AggregatedLoss` and writes only `compute`.
No loss computes logprobs or entropies; the Trainer does and passes them in `LossInputs`.
"""

from ludic.training.losses.aggregation import (
    AGGREGATIONS,
    aggregate,
    masked,
    masked_seq_mean,
    reduce_metrics,
)
from ludic.training.losses.base import AggregatedLoss, LossBatch, prepare
from ludic.training.losses.composite import CompositeLoss
from ludic.training.losses.policy_gradient import (
    CISPOLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
)
from ludic.training.losses.regularizers import (
    EntropyBonus,
    KLEstimator,
    KLToReferenceLoss,
    MaskedCrossEntropyLoss,
    kl_estimate,
)
from ludic.training.losses.rollout_correction import (
    Correction,
    RejectOutside,
    RolloutCorrection,
    TruncatedIS,
)
from ludic.training.losses.sequence import GMPOLoss, SequenceClippedSurrogateLoss

__all__ = [
    "AGGREGATIONS",
    "AggregatedLoss",
    "CISPOLoss",
    "CompositeLoss",
    "Correction",
    "EntropyBonus",
    "GMPOLoss",
    "KLEstimator",
    "KLToReferenceLoss",
    "LossBatch",
    "MaskedCrossEntropyLoss",
    "ReinforceLoss",
    "RejectOutside",
    "RolloutCorrection",
    "SequenceClippedSurrogateLoss",
    "TokenClippedSurrogateLoss",
    "TruncatedIS",
    "aggregate",
    "kl_estimate",
    "masked",
    "masked_seq_mean",
    "prepare",
    "reduce_metrics",
]
