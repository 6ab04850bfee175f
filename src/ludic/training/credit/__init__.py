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
from ludic.training.credit.awr import AWRCredit, awr_weights
from ludic.training.credit.baselines import (
    LeaveOneOutReturn,
    ReinforcePlusPlus,
    leave_one_out,
    whiten,
)
from ludic.training.credit.core import (
    default_anchor_key,
    discounted_returns,
    group_normalize,
    group_rollouts,
    rollout_group_key,
)
from ludic.training.credit.gigpo import (
    EpisodeStat,
    GiGPO,
    GiGPOTurnCredit,
    combine_advantages,
    episode_advantages,
    gigpo_group_credit,
)
from ludic.training.credit.hierarchical import (
    HierarchicalCredit,
    HierarchyMode,
    hierarchical_weights,
)

__all__ = [
    "AWRCredit",
    "ConstantCredit",
    "EpisodeStat",
    "EpisodicReturn",
    "GiGPO",
    "GiGPOTurnCredit",
    "GroupNormalizedReturn",
    "HierarchicalCredit",
    "HierarchyMode",
    "LeaveOneOutReturn",
    "MonteCarloReturn",
    "PerStepReward",
    "ReinforcePlusPlus",
    "awr_weights",
    "combine_advantages",
    "default_anchor_key",
    "discounted_returns",
    "episode_advantages",
    "gigpo_group_credit",
    "group_normalize",
    "group_rollouts",
    "hierarchical_weights",
    "leave_one_out",
    "rollout_group_key",
    "whiten",
]
