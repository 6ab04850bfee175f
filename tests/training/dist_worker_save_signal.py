"""Launched by test_fsdp_save_signal.py under torchrun (2 gloo ranks). Usage:
`dist_worker_save_signal.py OUT_DIR group|one`

Every rank trains the tiny Llama sharded with FSDP2 for 4 steps, checkpointing every 2, with
SIGINT and SIGTERM handled as the `ludic` command handles them (recorded, then a
KeyboardInterrupt that ends the run, exit code 128 + the signal). In step 2's save, once every
rank has gathered the full model state and before the optimizer state is gathered (rank 0 has
written nothing yet), rank 0 sends SIGTERM:

- `group`: to torchrun, which passes it on to every rank (as Kubernetes or Slurm stopping the
  job does); each rank waits until its own has arrived (the wakeup fd Python writes the signal
  number to) before it goes on with its part of the save;
- `one`: to itself only; rank 1 gets none.

Each rank writes OUT_DIR/rank{R}.json as it stops: the signals its handler got, each with the
trainer's step, whether it came inside `save_checkpoint` and whether step 2's checkpoint was
complete (its manifest written) then, and any other error the run raised. Lines go to stdout
with one `os.write` each (both ranks share torchrun's stdout).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from dist_worker_common import ALGORITHM, batches_for, trainer_config
from training_fakes import ListSource, tiny_llama

from ludic.training import Trainer
from ludic.training.checkpoint_manifest import MANIFEST
from ludic.training.parallel import FSDPRuntime
from ludic.training.parallel.fsdp import init_process_group_from_env

SAVED_STEP = 2


def say(line: str) -> None:
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


class Stopped(KeyboardInterrupt):
    """What the handler raises, as the `ludic` command's raises KeyboardInterrupt."""


class SignalledRuntime(FSDPRuntime):
    """`FSDPRuntime` whose first optimizer-state gather (inside step 2's save) sends SIGTERM
    first: rank 0 to `target`; then the ranks in `waiting` wait for their own to arrive."""

    def __init__(self, device: torch.device, *, target: int, waiting: bool, wakeup: int) -> None:
        super().__init__(device)
        self.target, self.waiting, self.wakeup = target, waiting, wakeup
        self.sent = False

    def full_optimizer_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        if not self.sent:
            self.sent = True
            if self.rank == 0:
                say(f"rank 0: SIGTERM to pid {self.target} in the save of step {SAVED_STEP}")
                os.kill(self.target, signal.SIGTERM)
            if self.waiting:
                select.select([self.wakeup], [], [])  # until the C handler wrote the signal
                os.read(self.wakeup, 16)
        return super().full_optimizer_state(model, optimizer)


def main() -> None:
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = init_process_group_from_env()
    ckpt = out_dir / "ckpt"
    saved = ckpt / f"step_{SAVED_STEP:08d}" / MANIFEST
    result: dict[str, Any] = {"handled": [], "raised": None}
    phase = ["training"]
    trainers: list[Trainer] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        step = trainers[0].step if trainers else None
        handled = {"signal": signum, "step": step, "phase": phase[0], "saved": saved.is_file()}
        result["handled"].append(handled)
        raise Stopped

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    runtime = SignalledRuntime(
        device,
        target=os.getppid() if mode == "group" else os.getpid(),
        waiting=mode == "group" or rank == 0,
        wakeup=read_end,
    )
    config = trainer_config(ckpt, every_n_steps=SAVED_STEP)
    trainer = Trainer(
        tiny_llama(seed=0), ALGORITHM, ListSource(batches_for(rank, world)), config, runtime=runtime
    )
    trainers.append(trainer)
    save = trainer.save_checkpoint

    def save_checkpoint() -> Path:
        phase[0] = "saving"
        try:
            return save()
        finally:
            phase[0] = "after the save"

    trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
    code = 0
    try:
        trainer.run(4, progress=False)
    except Stopped:
        code = 128 + result["handled"][0]["signal"]
    except Exception as e:
        result["raised"] = f"{type(e).__name__}: {e}"
        code = 1
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    say(f"rank {rank}: exits with {code}")
    sys.exit(code)


if __name__ == "__main__":
    main()
