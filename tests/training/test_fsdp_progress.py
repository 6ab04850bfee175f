"""Under torchrun, `Trainer.train(progress=True)` (what `make_trainer`'s runs call on every
rank) shows rank 0's progress bar alone: each rank's bar interleaved with the others' on one
terminal."""

from __future__ import annotations

import pytest
from dist_worker_common import torchrun

pytestmark = pytest.mark.distributed


def test_one_progress_bar_for_two_ranks() -> None:
    output = torchrun("dist_worker_progress.py")
    assert output.count("train:   0%") == 1, output[-4000:]  # each bar starts once
