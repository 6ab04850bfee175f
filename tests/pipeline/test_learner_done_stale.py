"""The learner's closing line counts every sample read under `samples`, the stale ones it
dropped untrained included; when some were dropped it says how many of those read were
trained, so `samples` is not taken for the trained count."""

from __future__ import annotations

from types import SimpleNamespace

from ludic.pipeline.learner_report import done_line


def _trainer() -> SimpleNamespace:
    return SimpleNamespace(step=7, checkpoints=None)


def test_the_done_line_says_how_many_samples_read_were_trained() -> None:
    totals = {"samples": 194, "redelivered": 64, "dropped_stale": 98}
    line = done_line(_trainer(), totals)
    assert line == (
        "learner done at step 7: 194 samples read, 96 of them trained, 98 dropped as stale "
        "(more than --max-lag policy versions behind), 64 redelivered (read but not "
        "acknowledged before a restart or a lost Redis reply); no checkpoint kept "
        "(--checkpoint-every None), so the trained weights are gone"
    )


def test_without_stale_drops_the_samples_read_are_the_samples_trained() -> None:
    line = done_line(_trainer(), {"samples": 32, "redelivered": 4}, world_size=2)
    assert line.startswith("learner done at step 7: 32 samples read on 2 ranks, 4 redelivered (")
    assert "of them trained" not in line
