"""The InteractionProtocol seam: the object that owns the agent <-> env loop.

Neither env nor agent runs episodes; a protocol does, and returns one Rollout per agent it
trains (plus child rollouts for delegation). Protocols hold their agents, so build a fresh
protocol per episode (the RolloutEngine does this through factories).
"""

from __future__ import annotations

import numbers
from typing import Protocol, runtime_checkable

from ludic.envs.base import LudicEnv
from ludic.inference.sampling import SamplingConfig
from ludic.types import Rollout


@runtime_checkable
class InteractionProtocol(Protocol):
    """Runs one episode of `env` and returns its rollouts.

    `sampling.seed`, when set, is the episode's sampling seed; agents derive a distinct,
    deterministic seed for each model call from it. A protocol records agent errors (parse
    failures, tool errors) in the rollout; exceptions from the env or the client propagate to
    the caller (the RolloutEngine turns them into a failed rollout). A protocol calls the env
    through `ludic.envs.base.call_env` (a synchronous method runs on a worker thread) and
    closes it with `closing_env`, which awaits `close` within `env.close_timeout_s`.
    """

    async def run(
        self,
        env: LudicEnv,
        *,
        env_seed: int | None = None,
        sampling: SamplingConfig | None = None,
    ) -> list[Rollout]: ...


def checked_env_seed(env_seed: object) -> int | None:
    """`env_seed` as an int (or None), or a TypeError naming the argument: a string or float
    seed would reach `env.reset` and the rollout's records as something no env seeds from."""
    if env_seed is None:
        return None
    if isinstance(env_seed, bool) or not isinstance(env_seed, numbers.Integral):
        raise TypeError(
            f"env_seed must be an int or None, got {type(env_seed).__name__} {env_seed!r}; "
            f"pass env_seed=int(...)"
        )
    return int(env_seed)
