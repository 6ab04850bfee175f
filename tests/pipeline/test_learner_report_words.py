"""The learner's step line printed `policy lag max -2` for a batch of samples newer than the
learner (a lag below 0), and its closing line a raw dict of counts. The step line now gives the
largest lag of the samples at or behind the learner's version and counts the ones ahead of it
apart, as the Trainer's `policy_lag/max` and `policy_lag/ahead` do (the source's
`pipeline/lag_max` leaves them out too); the closing line says in words what became of the
samples read."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from pipeline_fakes import sample

from ludic.pipeline.learner_report import TOTAL_KEYS, done_line, step_line
from ludic.pipeline.source_stale import Staleness

STEP = {"reward_mean": 0.5, "loss": 0.25, "grad_norm": 1.5, "policy_version": 4.0}


def test_the_step_line_counts_samples_ahead_apart_from_the_lag() -> None:
    metrics = {**STEP, "step_seconds": 2.0, "policy_lag/max": 1.0, "policy_lag/ahead": 2.0}
    line = step_line(3, {**metrics, "policy_lag/unknown": 1.0}, 5, 1)
    assert line == (
        "learner step 3: 5 samples (policy lag max 1; 2 ahead of the learner's policy version; "
        "1 of no recorded policy version), mean reward per sample +0.500, loss 0.25, grad norm "
        "1.5, policy version 4, 2.0s"
    )


def test_a_step_of_samples_all_ahead_prints_no_lag() -> None:
    line = step_line(3, {**STEP, "step_seconds": 2.0, "policy_lag/ahead": 4.0}, 8, 2)
    assert line.startswith(
        "learner step 3: 8 samples on 2 ranks (4 ahead of the learner's policy version), mean "
        "reward per sample on rank 0 +0.500"
    )
    assert step_line(3, STEP, 0, 1).startswith("learner step 3: 0 samples, mean reward")


def test_the_source_lag_leaves_samples_ahead_out() -> None:
    staleness = Staleness(max_lag=2, stale="drop", stale_decay=0.5, current_version=lambda: 3)
    stats: Counter[str] = Counter()
    lags: list[int] = []
    for version in (5, 4, 2, 3):  # two ahead of the learner's version 3
        assert staleness.apply(sample(versions=(version,)), stats, lags) is not None
    assert lags == [1, 0] and stats == Counter(ahead=2)


def test_the_closing_line_says_what_became_of_every_sample_read() -> None:
    counts = (100, 6, 2, 10, 5, 7, 3, 1, 4, 1, 2)  # samples, redelivered, duplicates, ...
    totals = dict(zip(TOTAL_KEYS, counts, strict=True))
    line = done_line(SimpleNamespace(step=9, checkpoints=None), totals, world_size=2)
    assert line == (
        "learner done at step 9: 100 samples read on 2 ranks, 85 of them trained, 10 dropped "
        "as stale (more than --max-lag policy versions behind), 5 dropped as a killed "
        "learner's (versions past this one's start), 7 trained downweighted as stale "
        "(--stale downweight), 3 of a policy version ahead of the learner's (trained; warned "
        "above), 6 redelivered (read but not acknowledged before a restart or a lost Redis "
        "reply), 2 skipped as duplicates, 4 dead-lettered as another run's, 1 dead-lettered "
        "as invalid, 1 trimmed from the stream before they were trained (lost), 2 rank waits "
        "timed out without a sample (--max-wait-s); no checkpoint kept (--checkpoint-every "
        "None), so the trained weights are gone"
    )
