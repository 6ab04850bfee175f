"""Credit split over an episode's turns (`split_over_turns`) is refused in sample mode
"episode", where the episode is one sample: its weight would silently be A / turns (a 3-turn
winner weighed a third of a 1-turn loser). Refused before any episode runs, and where samples
are built from rollouts given (the offline path)."""

from __future__ import annotations

from typing import Any

import pytest

from ludic.rollouts.batch import build_rollout_samples, generate_batch
from ludic.training.credit import GroupNormalizedReturn


class NeverRun:
    async def run(self, requests: Any) -> Any:
        raise AssertionError("an episode ran before the settings were checked")


async def test_generate_batch_refuses_before_any_episode_runs() -> None:
    with pytest.raises(ValueError, match=r"split_over_turns=True\) with sample_mode 'episode'"):
        await generate_batch(
            NeverRun(),  # type: ignore[arg-type]
            [],
            GroupNormalizedReturn(split_over_turns=True),
            sample_mode="episode",
        )


def test_building_samples_from_given_rollouts_refuses_it_too() -> None:
    with pytest.raises(ValueError, match="sample_mode='turn'"):
        build_rollout_samples(
            [], GroupNormalizedReturn(split_over_turns=True), "episode", "share", None
        )


def test_turn_mode_and_unsplit_credit_are_untouched() -> None:
    assert build_rollout_samples(
        [], GroupNormalizedReturn(split_over_turns=True), "turn", "share", None
    ) == ([], [])
    assert build_rollout_samples([], GroupNormalizedReturn(), "episode", "share", None) == ([], [])
