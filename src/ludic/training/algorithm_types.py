"""The seams of an RL algorithm: what a loss receives, what it returns, and the pair
(credit assigner, loss) that makes an algorithm. Implementations live in the `credit`,
`losses` subpackages and `algorithm.py`; the Trainer only knows these types.

Shape legend: B = sequences in the micro-batch, T = padded tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch

from ludic.rollouts.samples import CreditAssigner

# How per-token terms become one scalar. The normaliser is always a count over the WHOLE
# optimizer batch (all micro-batches and ranks), so splitting a batch into micro-batches and
# summing their losses equals the loss of the one big batch.
#   token_mean:      sum_i sum_t m_it * l_it / sum_i sum_t m_it
#   seq_mean_token_mean: (1/N) sum_i [ sum_t m_it * l_it / sum_t m_it ]
#   seq_mean_token_sum:  (1/N) sum_i sum_t m_it * l_it
#   constant:        sum_i sum_t m_it * l_it / (N * C)        (Dr.GRPO, C = max_tokens)
#   token_sum:       sum_i sum_t m_it * l_it                  (no normaliser)
Aggregation = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant", "token_sum"
]


@dataclass(frozen=True, kw_only=True, slots=True)
class LossInputs:
    """Everything a loss may use, for one micro-batch of padded sequences.

    `logprobs_BT[b, t]` is the current policy's log p(input_ids[b, t] | input_ids[b, :t]);
    position 0 (no context) is 0 and masked. `action_mask_BT` is 1.0 on tokens to train on.
    `behavior_logprobs_BT` are the sampling policy's logprobs (0 where unmasked), None for
    offline data without them. `advantages_B` is each sequence's SAWItem weight.
    `total_action_tokens` and `total_sequences` count the whole optimizer batch.
    `is_weights_BT` are rollout-correction weights (detached, set by
    `losses.RolloutCorrection`): policy losses multiply each token's term by them, regularisers
    (KL, entropy) ignore them; None means 1.
    """

    logprobs_BT: torch.Tensor
    action_mask_BT: torch.Tensor
    advantages_B: torch.Tensor
    total_action_tokens: float
    total_sequences: float
    behavior_logprobs_BT: torch.Tensor | None = None
    ref_logprobs_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None
    is_weights_BT: torch.Tensor | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LossOutput:
    """The micro-batch's share of the batch loss (already divided by batch-wide counts, so
    summing over micro-batches gives the batch loss) and metrics as floats. Metrics are
    additive too: each is this micro-batch's contribution to the batch-level value."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Loss(Protocol):
    """A policy loss: configuration in the object, maths in `__call__`."""

    def __call__(self, inputs: LossInputs) -> LossOutput: ...

    @property
    def needs_ref_logprobs(self) -> bool: ...

    @property
    def needs_entropy(self) -> bool: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class RLAlgorithm:
    """An algorithm is credit assignment plus a loss; `name` is for logs."""

    name: str
    credit_assigner: CreditAssigner
    loss: Loss
