"""`ludic actor`'s per-batch line: a batch whose every episode failed has no mean reward (its
stats hold 0.0, a reward no episode earned), so the line says it is unknown instead of quoting
+0.000; a batch with a successful episode still quotes its reward, 0.0 included."""

from __future__ import annotations

from ludic.pipeline import commands
from ludic.pipeline.actor import ActorBatchStats
from ludic.pipeline.config import ActorConfig


def stats(*, rollouts: int, failed: int, samples: int, reward: float) -> ActorBatchStats:
    return ActorBatchStats(
        batch_index=3, num_rollouts=rollouts, num_failed=failed, num_samples=samples,
        mean_reward=reward, policy_version_min=None, policy_version_max=None,
        backpressure_seconds=0.0, generate_seconds=1.0,
    )  # fmt: skip


def test_a_batch_whose_every_episode_failed_has_no_reward() -> None:
    line = commands.batch_line(ActorConfig(), stats(rollouts=4, failed=4, samples=0, reward=0.0))
    assert "0 samples from 4 episodes (4 failed), mean episode reward unknown," in line
    assert "+0.000" not in line
    assert line.endswith(
        "; every episode failed, so nothing reached the stream (first error logged above)"
    )


def test_a_batch_with_a_successful_episode_quotes_its_reward() -> None:
    line = commands.batch_line(ActorConfig(), stats(rollouts=4, failed=3, samples=2, reward=0.0))
    assert "4 episodes (3 failed), mean episode reward +0.000," in line  # earned by one episode
    line = commands.batch_line(ActorConfig(), stats(rollouts=4, failed=0, samples=0, reward=-0.5))
    assert "mean episode reward -0.500," in line
    assert line.endswith("; no sample reached the stream (no episode produced a training turn)")
