"""A Ctrl-C under torchrun on 2 gloo ranks: the signal lands in each rank's Python at another
point of the step, so the ranks are not in the same collective when they close. The
interrupted rank's `trainer.close()` must not wait at the closing barrier for a peer that is
inside the step's collectives (the peer waited there until torchrun killed it, 30 s later),
and the peer's collective then fails instead of waiting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dist_worker_common import torchrun_exit

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.mark.parametrize(
    ("mode", "closed_during"),
    [("loss", "KeyboardInterrupt"), ("await", "CancelledError")],  # await: as `ludic learner`
)
def test_an_interrupted_rank_closes_without_waiting_for_the_others(
    tmp_path: Path, mode: str, closed_during: str
) -> None:
    returncode, output = torchrun_exit(
        "dist_worker_interrupt.py", str(tmp_path), mode, timeout_s=120
    )
    results = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)}
    interrupted = {"raised": "KeyboardInterrupt", "close_raised": None}
    assert results[1] == {**interrupted, "closed_during": closed_during}, output[-4000:]
    # the peer's collective failed; its own error, not the closing barrier's, is what it raises
    assert results[0]["raised"] not in (None, "KeyboardInterrupt"), output[-4000:]
    assert results[0]["close_raised"] is None, output[-4000:]
    assert returncode == 0, output[-4000:]  # each rank's script handled what it raised
