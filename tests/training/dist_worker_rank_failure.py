"""Launched by test_fsdp_rank_failures.py under torchrun (2 gloo ranks). Usage:
`dist_worker_rank_failure.py OUT_DIR MODE [MODE ...]`

Every rank trains the tiny Llama sharded with FSDP2 for 4 steps, as a user's script does (the
Trainer in `try/finally: trainer.close()`); something that only rank 0 holds fails there and
nowhere else:

- `publish`: rank 0's publisher raises `WeightPushError` (the server refuses) at version 2;
- `checkpoint`: checkpoints every 2 steps (every rank has the manager); rank 0's disk "fills
  up" while it writes step 4's optimizer state (`torch.save` raises ENOSPC there);
- `logger`: rank 0's logger raises ENOSPC at step 2;
- `eval`: `eval_fn` (every rank, every step) calls an eval server on rank 0 only, which is
  unreachable at step 2 (rank 1's returns {}).

and in rank 1's own code in the third step (after `FAIL_AT` steps), nowhere else:

- `source`: rank 1's batch source raises `ConnectionError` (its queue went away);
- `loss`: rank 1's loss raises `ValueError` in its first micro-batch (rank 0's does fine and
  goes on into the backward's collectives).

The modes run one after the other in the one launch (a torchrun start costs more than a
mode's 4 steps), each with its own Trainer, as a user's script that failed would be rerun. For
each mode every rank writes OUT_DIR/MODE/rank{R}.json with the error it raised (type, its
classes, message, the trainer's step) and OUT_DIR/MODE/rank{R}.escaped once that error has
left the Trainer's `try/finally` (where a script of one mode would exit non-zero); a rank left
waiting in a collective writes nothing and the test's timeout fails it. Between modes the
ranks meet at a barrier and check that they are at the same mode (a failure that left their
collectives out of step stops the launch there), and the launch exits non-zero when any mode
raised.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from dist_worker_common import ALGORITHM, batches_for, record_outcome, trainer_config
from training_fakes import ListSource, WeightedNLL, tiny_llama

import ludic.training.checkpoint as checkpoint_module
from ludic.distributed import WeightPushError
from ludic.distributed.interfaces import Weights
from ludic.training import LossInputs, LossOutput, RLAlgorithm, Trainer, TrainerConfig
from ludic.training.batching.types import SAWBatch
from ludic.training.parallel import FSDPRuntime
from ludic.training.parallel.fsdp import init_process_group_from_env

FAIL_AT = 2
"""The step (and policy version) at which rank 0's part fails."""


class RefusedPublisher:
    """Records each version; the server refuses version `FAIL_AT`."""

    def __init__(self) -> None:
        self.versions: list[int] = []

    def publish(self, weights: Weights, *, version: int) -> None:
        if version == FAIL_AT:
            raise WeightPushError(
                f"server http://127.0.0.1:8000 refused the push of version {version}: "
                "409 version conflict"
            )
        self.versions.append(version)


class FullDiskLogger:
    def log(self, metrics: dict[str, float], step: int) -> None:
        if step == FAIL_AT:
            raise OSError(errno.ENOSPC, "No space left on device", "metrics.jsonl")

    def close(self) -> None:
        return None


class LostQueueSource(ListSource):
    """`ListSource` whose queue goes away after `FAIL_AT` batches."""

    async def next_batch(self) -> SAWBatch:
        if self.position == FAIL_AT:
            raise ConnectionError("redis://127.0.0.1:6390 closed the connection")
        return await super().next_batch()


@dataclass(frozen=True, kw_only=True)
class FailingLoss(WeightedNLL):
    """`WeightedNLL` that raises once `steps_done()` reaches `FAIL_AT`."""

    steps_done: Callable[[], int]

    def __call__(self, inputs: LossInputs) -> LossOutput:
        if self.steps_done() == FAIL_AT:
            raise ValueError("advantages_B holds a nan: the credit assigner divided by zero")
        return WeightedNLL.__call__(self, inputs)


@contextlib.contextmanager
def _disk_full_at_step_4() -> Iterator[None]:
    """Rank 0's `torch.save` of step 4's optimizer state fails as on a full disk (until the
    block ends)."""
    real_save = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        path = Path(str(f))
        if path.name == "optimizer.pt" and re.search(r"step_0*4(?!\d)", path.parent.name):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(obj, f, *args, **kwargs)

    checkpoint_module.torch.save = save  # type: ignore[assignment]
    try:
        yield
    finally:
        checkpoint_module.torch.save = real_save  # type: ignore[assignment]


def _trainer(out_dir: Path, mode: str, rank: int, world: int) -> Trainer:
    batches = batches_for(rank, world)
    source = ListSource(batches)
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11)
    algorithm = ALGORITHM
    kwargs: dict[str, Any] = {}
    trainers: list[Trainer] = []
    if mode == "source":
        source = LostQueueSource(batches) if rank == 1 else source
    elif mode == "loss":
        if rank == 1:
            loss = FailingLoss(steps_done=lambda: trainers[0].step)
            algorithm = RLAlgorithm(
                name="test", credit_assigner=ALGORITHM.credit_assigner, loss=loss
            )
    elif mode == "publish":
        kwargs["publisher"] = RefusedPublisher() if rank == 0 else None
    elif mode == "checkpoint":
        config = trainer_config(out_dir / "checkpoints", every_n_steps=2)
    elif mode == "logger":
        kwargs["logger"] = FullDiskLogger() if rank == 0 else None
    elif mode == "eval":
        config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11, eval_every=1)

        def eval_fn(trainer: Trainer) -> dict[str, float]:
            if not trainer.runtime.is_main:
                return {}
            if trainer.step == FAIL_AT:
                raise ConnectionError("eval server http://127.0.0.1:8001 unreachable")
            return {"accuracy": 0.5}

        kwargs["eval_fn"] = eval_fn
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    trainers.append(Trainer(tiny_llama(seed=0), algorithm, source, config, **kwargs))
    return trainers[0]


def _run_mode(out_dir: Path, mode: str, rank: int, world: int) -> bool:
    """One mode's run, as a script of its own would do it; True when an error left it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    disk = _disk_full_at_step_4() if mode == "checkpoint" and rank == 0 else None
    with disk or contextlib.nullcontext():
        trainer = _trainer(out_dir, mode, rank, world)
        assert isinstance(trainer.runtime, FSDPRuntime)

        def run(result: dict[str, Any]) -> None:
            trainer.run(4, progress=False)

        try:
            record_outcome(out_dir, rank, trainer, run)
        except Exception as error:
            (out_dir / f"rank{rank}.escaped").write_text(type(error).__name__)
            return True
    return False


MODE_HANG_S = 120
"""A mode not done by then hung: the launch ends with every thread's stack, naming the mode."""


def main() -> None:
    out_dir, modes = Path(sys.argv[1]), sys.argv[2:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    init_process_group_from_env()  # one group for every mode: each Trainer joins it
    failed = False
    for mode in modes:
        # a hang in one mode ends the launch naming that mode (its stacks, then this line's mode)
        print(f"rank {rank}: mode {mode!r}", file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(MODE_HANG_S, exit=True)
        failed |= _run_mode(out_dir / mode, mode, rank, world)
        dist.barrier()
        at: list[object] = [None] * world
        dist.all_gather_object(at, mode)
        if at != [mode] * world:
            raise SystemExit(f"rank {rank}: the ranks are out of step after {mode!r}: {at}")
    faulthandler.cancel_dump_traceback_later()
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
