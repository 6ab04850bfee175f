"""The README's evaluation block runs on the Training block's engine (64 episodes in flight,
`episode_timeout_s=120` from each episode's start); walked on a loaded 2-core machine after
"Generation in another process" had set one torch thread, all 64 timed out and the block printed
0.0 0.0. The section must say so and how to avoid it; the engine's timeout is per episode."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _flat(section_heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(section_heading)
    return " ".join(text[start : text.index("\n## ", start + 1)].split())


def test_the_training_engine_the_eval_block_uses_limits_each_episode_and_runs_64() -> None:
    rollouts = _flat("## From rollouts to samples")
    assert re.search(r"concurrency=64, episode_timeout_s=120", rollouts)


def test_the_evaluation_section_says_its_episodes_can_all_time_out_and_the_way_out() -> None:
    section = _flat("## Evaluation, viewer, plots")
    assert "counts each episode from its start" in section
    assert "all 64 can time out" in section
    assert "larger `episode_timeout_s` (or None) or a smaller `concurrency`" in section
