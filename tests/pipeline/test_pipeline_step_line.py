"""The learner's step and closing lines under several ranks: the sample counts are all ranks'
(summed through the runtime's all-reduce), and what is rank 0's alone says so."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from ludic.pipeline.commands import TOTAL_KEYS, _across_ranks, _done_line, step_line

METRICS = {"num_samples": 16.0, "batch/pipeline/lag_max": 2.0, "reward_mean": 0.5, "loss": 0.1}


class _TwoRanks:
    """A runtime of 2 ranks where the other rank holds the same numbers as this one."""

    world_size = 2

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        return [2 * v for v in values]


def test_two_ranks_count_both_ranks_samples_and_label_rank_0s_numbers() -> None:
    [samples] = _across_ranks(_TwoRanks(), [METRICS["num_samples"]])
    line = step_line(3, METRICS, samples, 2)
    assert line.startswith("learner step 3: 32 samples on 2 ranks (policy lag max 2 on rank 0)")
    assert "mean reward per sample on rank 0 +0.500" in line


def test_one_rank_says_nothing_about_ranks() -> None:
    assert _across_ranks(SimpleNamespace(world_size=1), [16.0]) == [16.0]
    line = step_line(3, METRICS, 16.0, 1)
    assert line.startswith("learner step 3: 16 samples (policy lag max 2), mean reward per")
    assert "rank" not in line


def test_the_done_line_names_the_ranks_its_totals_cover() -> None:
    trainer = SimpleNamespace(step=2, checkpoints=None)
    totals = _across_ranks(_TwoRanks(), [16.0 if k == "samples" else 0.0 for k in TOTAL_KEYS])
    counts = {k: int(v) for k, v in zip(TOTAL_KEYS, totals, strict=True) if v}
    assert _done_line(trainer, counts, 2).startswith(
        "learner done at step 2: {'samples': 32} (all 2 ranks); no checkpoint kept"
    )
    assert "ranks" not in _done_line(trainer, {"samples": 16}, 1)
