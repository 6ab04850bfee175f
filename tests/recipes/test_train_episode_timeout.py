"""`ludic train --episode-timeout-s` (default 600 s, as `ludic eval`): an env whose step never
returned failed no episode and printed nothing, so the run stalled silently forever; now the
episode fails at the deadline, logged, and the batch goes on without it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ludic.envs import TicTacToeEnv
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import _rollout_source
from ludic.recipes.train_checks import check_counts
from ludic.training import make_grpo


def test_the_default_bounds_every_episode() -> None:
    assert TrainConfig().episode_timeout_s == 600.0


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_a_timeout_not_above_zero_is_refused_naming_the_flag(value: float) -> None:
    with pytest.raises(ValueError, match=r"--episode-timeout-s must be > 0 seconds"):
        check_counts(TrainConfig(episode_timeout_s=value))


def test_the_rollout_engine_gets_the_flag() -> None:
    run = SimpleNamespace(
        cfg=TrainConfig(episode_timeout_s=2.5),
        env_factory=TicTacToeEnv,
        env_kwargs={},
        context=None,
        parser=None,
    )
    source = _rollout_source(run, make_grpo(), client=None)  # type: ignore[arg-type]
    assert source.engine.episode_timeout_s == 2.5
