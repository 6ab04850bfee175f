"""A SIGTERM to a torchrun job while it saves a checkpoint (FSDP2, 2 gloo ranks). Every rank
takes part in the save (each gathers its shards of the full states rank 0 writes), but only
rank 0 deferred the signal, and only while it wrote: a rank interrupted in its gather stopped
there, so the checkpoint of that step was never written (and the ranks stopped at different
points). Every rank now defers from its first gather to the end of rank 0's write, the
checkpoint is whole, and every rank then stops with the signal, also a rank it did not reach
(the ranks agree after the save)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from dist_worker_common import torchrun_exit

from ludic.training import CheckpointConfig, CheckpointManager

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _launch(tmp_path: Path, mode: str) -> tuple[dict[int, dict[str, Any]], str]:
    _, output = torchrun_exit("dist_worker_save_signal.py", str(tmp_path), mode, timeout_s=240)
    results = {}
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        assert path.is_file(), f"rank {rank} wrote nothing:\n{output[-6000:]}"
        results[rank] = json.loads(path.read_text())
    return results, output


def _check_whole(tmp_path: Path) -> None:
    """Step 2's checkpoint is complete, verifies file by file and loads; nothing after it."""
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "ckpt")))
    assert manager.list() == [manager.path_for(2)]
    manager.verify(manager.path_for(2), deep=True)
    loaded = manager.load()
    assert loaded.step == 2 and loaded.rank_states is not None and len(loaded.rank_states) == 2


STOPPED_AFTER_THE_SAVE = {"signal": signal.SIGTERM, "step": 2, "phase": "saving", "saved": True}
"""A rank's handler called once, for SIGTERM, as step 2's save ends with the checkpoint whole."""


@pytest.mark.parametrize("mode", ["group", "one"])
def test_a_signal_during_a_save_lets_every_rank_finish_it_then_stops_every_rank(
    tmp_path: Path, mode: str
) -> None:
    """`group`: torchrun passes the SIGTERM on to both ranks mid-save; `one`: only rank 0 gets
    it, and rank 1 stops with it after the save instead of going on into step 3 alone."""
    results, output = _launch(tmp_path, mode)
    for rank, result in results.items():
        assert result == {"handled": [STOPPED_AFTER_THE_SAVE], "raised": None}, (rank, output)
        assert f"rank {rank}: exits with 143" in output.splitlines(), output[-6000:]
    _check_whole(tmp_path)
