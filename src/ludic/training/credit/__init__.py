"""Credit assignment: rollouts in, one float weight per turn out (the `CreditAssigner` seam).

Assigners are configuration objects over the pure functions in `core`; they do not build samples
or touch tensors.
"""

from ludic.training.credit.assigners import (
    ConstantCredit,
    EpisodicReturn,
    GroupNormalizedReturn,
    MonteCarloReturn,
    PerStepReward,
)
from ludic.training.credit.core import (
    default_anchor_key,
    discounted_returns,
    group_normalize,
    rollout_group_key,
)
from ludic.training.credit.gigpo import (
    GiGPO,
    GiGPOTurnCredit,
    combine_advantages,
    gigpo_group_credit,
)

__all__ = [
    "ConstantCredit",
    "EpisodicReturn",
    "GiGPO",
    "GiGPOTurnCredit",
    "GroupNormalizedReturn",
    "MonteCarloReturn",
    "PerStepReward",
    "combine_advantages",
    "default_anchor_key",
    "discounted_returns",
    "gigpo_group_credit",
    "group_normalize",
    "rollout_group_key",
]
