"""`every_episode_failed` (beside `BatchStats`, whose 0.0 mean_reward it tells from a reward
earned): the one rule `ludic train`'s closing line, `ludic actor`'s batch line and `ludic plot`
read. It lives in `ludic.rollouts`, so none of them imports the plotting module for it."""

from __future__ import annotations

import subprocess
import sys

from ludic.rollouts import every_episode_failed


def test_a_batch_whose_episodes_all_failed_is_named() -> None:
    record = {"batch/num_rollouts": 4, "batch/num_failed": 4, "batch/mean_reward": 0.0}
    assert every_episode_failed(record)
    assert not every_episode_failed({**record, "batch/num_failed": 3})


def test_no_episode_or_no_counts_is_not_such_a_batch() -> None:
    assert not every_episode_failed({"batch/num_rollouts": 0, "batch/num_failed": 0})
    assert not every_episode_failed({"batch/mean_reward": 0.0})
    assert not every_episode_failed({"batch/num_rollouts": True, "batch/num_failed": True})
    assert not every_episode_failed({"batch/num_rollouts": "4", "batch/num_failed": "4"})


def test_the_actor_records_counts_without_a_prefix() -> None:
    record = {"num_rollouts": 2, "num_failed": 2.0}
    assert every_episode_failed(record, prefix="")
    assert not every_episode_failed(record)


def test_the_rule_does_not_load_the_plotting_module() -> None:
    code = (
        "import sys; import ludic.rollouts, ludic.recipes.train_report, ludic.pipeline.actor; "
        "print('ludic.viz.plots' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
