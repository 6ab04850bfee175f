"""A `ludic learner` launch that stopped under `--max-wait-s` having applied no update (no
sample came, or every one read was stale or dead-lettered) exited 0 with a `learner done at
step 0` line, so a supervisor took it for a finished run; as `ludic train` does, it now exits
1, its closing line naming why nothing was trained. A launch that trained a step still exits 0
(`test_pipeline_processes`). A real redis-server and a real learner process for the exit code;
the line itself through `nothing_trained_line`."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_fakes import RedisServer, redis_server, spawn
from test_pipeline_processes import _learner

from ludic.pipeline.learner_report import nothing_trained_line

__all__ = ["redis_server"]


@pytest.mark.redis
@pytest.mark.timeout(300)
def test_a_learner_that_trained_nothing_exits_1_naming_why(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    log = tmp_path / "learner.log"
    flags = ["--steps", "2", "--max-wait-s", "1", "--checkpoint-every", "None"]
    process = spawn(_learner(redis_server, tmp_path, extra=flags), log)
    code = process.wait(timeout=240)
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "learner done at step 0" in text  # the counts are still logged first
    [error] = [line for line in text.splitlines() if line.startswith("ludic learner: error:")]
    assert error.startswith(
        "ludic learner: error: no step trained in this launch: no samples arrived for 1.0s. "
        "The model is the one this launch started from"
    ), text[-3000:]
    assert "Traceback" not in text


def test_the_line_says_what_became_of_the_samples_read() -> None:
    totals = {"samples": 8, "dropped_stale": 8, "foreign_run": 4}  # foreign: not in samples
    line = nothing_trained_line("no trainable sample arrived for 5.0s: ...", totals, 0)
    assert line.startswith(
        "no step trained in this launch: no trainable sample arrived for 5.0s: ...; over this "
        "launch, samples read but not trained: 8 dropped as stale (more than --max-lag policy "
        "versions behind), 4 dead-lettered as another run's. The model is the one this launch "
        "started from"
    )


def test_a_launch_whose_every_step_was_skipped_says_so() -> None:
    line = nothing_trained_line(None, {}, 3)
    assert line.startswith(
        "no step trained in this launch: each of its 3 step(s) was skipped (each said why "
        "above). The model"
    )
