"""Launched by test_fsdp_publish.py under torchrun (2 gloo ranks). Usage:
`dist_worker_publish_server_down.py OUT_DIR SERVER_URL TOKEN MODEL_DIR SERVER_PID`

Rank 0 holds a verified `BroadcastPolicyPublisher` to a `ludic serve` server (the other rank
none), and the FSDP2 Trainer publishes after every step. Step 1 publishes version 1 (verified).
Then rank 0 stops the server (SIGTERM to SERVER_PID, waiting until it has exited) and the run
goes on: step 2's push fails on rank 0. Each rank writes OUT_DIR/rank{R}.json with the error it
raised (type, classes, message, the trainer's step) before the Trainer's closing barrier, and
re-raises it, so both exit non-zero.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from dist_worker_common import ALGORITHM, batches_for, record_outcome
from training_fakes import ListSource

from ludic.distributed import BroadcastPolicyPublisher
from ludic.models import load_model
from ludic.training import Trainer, TrainerConfig
from ludic.training.parallel import FSDPRuntime


def _stop(pid: int) -> None:
    """SIGTERM the server and wait until the process is gone (it is not our child: poll)."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _exited(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """True once `pid` has exited. Its parent, the test, is blocked waiting for torchrun and
    reaps it only afterwards: until then it is a zombie (Linux /proc), which `kill(pid, 0)`
    still finds."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return False


def main() -> None:
    out_dir, url, token, model_dir = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    server_pid = int(sys.argv[5])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model, _ = load_model(model_dir, dtype=torch.float32)
    publisher = None
    if rank == 0:
        publisher = BroadcastPolicyPublisher(
            url, token, timeout_s=20, probe_model=model, probe_every=1
        )
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11)
    source = ListSource(batches_for(rank, world))
    trainer = Trainer(model, ALGORITHM, source, config, publisher=publisher)
    assert isinstance(trainer.runtime, FSDPRuntime)

    def run(result: dict[str, Any]) -> None:
        trainer.run(1, progress=False)
        if publisher is not None:
            assert publisher.last_push is not None and publisher.last_push.version == 1
            result["published"] = publisher.last_push.version
            _stop(server_pid)
        trainer.run(2, progress=False)

    record_outcome(out_dir, rank, trainer, run)


if __name__ == "__main__":
    main()
