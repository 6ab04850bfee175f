"""A `ludic learner` under torchrun whose ranks all time out under `--max-wait-s` before any
sample came skips that step (every rank's batch is empty), and saved its unchanged weights as
checkpoint step 1 before exiting 1: a resume then started from a step that trained nothing.
It now writes no checkpoint for a launch whose every step was skipped, says so in its closing
line and still exits 1. Two gloo ranks of a real learner process on a real redis-server."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server
from test_pipeline_processes import _torchrun_learner

__all__ = ["redis_server"]


@pytest.mark.redis
@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_ranks_that_trained_nothing_save_no_checkpoint(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    log = tmp_path / "learner.log"
    flags = ["--steps", "3", "--max-wait-s", "1"]  # checkpoints on (every 50 steps)
    process = _torchrun_learner(redis_server, tmp_path, flags, log)
    code = process.wait(timeout=400)
    text = log.read_text()
    assert code != 0, text[-3000:]  # torchrun: 1 from each rank
    assert "no samples arrived for 1.0s on any of the 2 ranks" in text, text[-3000:]
    assert (
        "learner done at step 1: 0 samples read on 2 ranks, 2 rank waits timed out without a "
        "sample (--max-wait-s); no step trained, so no checkpoint was written"
    ) in text, text[-3000:]
    assert "ludic learner: error: no step trained in this launch" in text, text[-3000:]
    assert not list((tmp_path / "learner" / "checkpoints").glob("step_*")), text[-3000:]
