"""`ludic actor --metrics-path`: a batch whose every episode failed has no mean reward (BatchStats
holds 0.0, a reward no episode earned). Its record writes mean_reward null, and `ludic plot`, which
reads the file, leaves that batch a gap by the rule it gaps the Trainer's batch/mean_reward by
(also in a file an earlier actor wrote with 0.0). The per-batch line names the policy versions
of the batch's samples, and says there is none when the batch has no sample (it printed
'policy versions None..None')."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ludic.pipeline import commands
from ludic.pipeline.actor import ActorBatchStats
from ludic.pipeline.config import ActorConfig
from ludic.rollouts import every_episode_failed
from ludic.viz import metrics_figure, read_metrics

KEYS = [
    "batch_index", "num_rollouts", "num_failed", "num_samples", "mean_reward",
    "policy_version_min", "policy_version_max", "backpressure_seconds", "generate_seconds",
]  # fmt: skip


def stats(
    *, failed: int, reward: float, versions: tuple[int, int] | None = None, index: int = 0
) -> ActorBatchStats:
    low, high = versions or (None, None)
    return ActorBatchStats(
        batch_index=index, num_rollouts=4, num_failed=failed,
        num_samples=0 if versions is None else 6, mean_reward=reward, policy_version_min=low,
        policy_version_max=high, backpressure_seconds=0.0, generate_seconds=1.0,
    )  # fmt: skip


def test_the_record_of_a_batch_whose_every_episode_failed_has_no_reward() -> None:
    record = stats(failed=4, reward=0.0).to_dict()
    assert list(record) == KEYS  # the file's keys stay as they were
    assert record["mean_reward"] is None and (record["num_failed"], record["num_rollouts"]) == (
        4,
        4,
    )
    assert json.loads(json.dumps(record))["mean_reward"] is None  # null in the JSONL
    assert every_episode_failed(record, prefix="")


def test_a_batch_with_a_successful_episode_keeps_its_reward_0_included() -> None:
    record = stats(failed=3, reward=0.0, versions=(2, 2)).to_dict()
    assert list(record) == KEYS and record["mean_reward"] == 0.0  # earned by one episode
    assert not every_episode_failed(record, prefix="")


def rewards_plotted(path: Path) -> list[float]:
    """The y values `ludic plot` draws for the actor's mean_reward (NaN: a gap)."""
    figure = metrics_figure(read_metrics(path))
    (line,) = figure.axes[0].lines
    return [float(y) for y in line.get_ydata()]


def test_ludic_plot_leaves_a_failed_batch_a_gap(tmp_path: Path) -> None:
    path = tmp_path / "actor_metrics.jsonl"
    batches = [stats(failed=0, reward=0.5, versions=(0, 0), index=0)]
    batches += [stats(failed=4, reward=0.0, index=1)]
    batches += [stats(failed=1, reward=0.75, versions=(0, 1), index=2)]
    path.write_text("".join(json.dumps(b.to_dict()) + "\n" for b in batches))
    plotted = rewards_plotted(path)
    assert len(plotted) == 3 and plotted[0] == 0.5 and plotted[2] == 0.75
    assert math.isnan(plotted[1])


def test_a_file_an_earlier_actor_wrote_with_0_is_gapped_too(tmp_path: Path) -> None:
    path = tmp_path / "actor_metrics.jsonl"
    rows = [{**stats(failed=0, reward=0.5, versions=(0, 0)).to_dict(), "mean_reward": 0.5}]
    rows += [{**stats(failed=4, reward=0.0).to_dict(), "mean_reward": 0.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plotted = rewards_plotted(path)
    assert plotted[0] == 0.5 and math.isnan(plotted[1])


def test_the_batch_line_names_the_policy_versions_or_their_absence() -> None:
    cfg = ActorConfig()
    line = commands.batch_line(cfg, stats(failed=4, reward=0.0))
    assert ", no policy version (no sample)," in line and "None" not in line
    assert ", policy version 7," in commands.batch_line(
        cfg, stats(failed=0, reward=1.0, versions=(7, 7))
    )
    assert ", policy versions 3..5," in commands.batch_line(
        cfg, stats(failed=0, reward=1.0, versions=(3, 5))
    )
