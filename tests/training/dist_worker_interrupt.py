"""Launched by test_interrupted_rank_close.py under torchrun (2 gloo ranks). Usage:
`dist_worker_interrupt.py OUT_DIR [loss|await]`

Every rank trains the tiny Llama sharded with FSDP2, as a user's script does (the Trainer in
`try/finally: trainer.close()`). In the third step (rank 1 has samples there) a Ctrl-C lands
in rank 1's Python (its loss raises KeyboardInterrupt, as the signal handler does) while rank
0 has gone on into the backward's collectives, as when torchrun passes a Ctrl-C on to its
workers. With `await`, the run is shaped as `ludic learner`'s (the CLI's SIGINT handler raising
KeyboardInterrupt, the Trainer in `asyncio.run` with `trainer.close()` in the coroutine's
`finally`) and the Ctrl-C lands while rank 1's event loop waits for its third batch (as on
Redis): its `finally` then sees `CancelledError`, not KeyboardInterrupt. Each rank writes OUT_DIR/rank{R}.json once its `trainer.close()` has returned or
raised: what the run raised and what `close()` raised (None when nothing). A rank left waiting
writes nothing and the test's timeout fails it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_worker_common import ALGORITHM, batches_for
from training_fakes import ListSource, WeightedNLL, tiny_llama

from ludic.training import LossInputs, LossOutput, RLAlgorithm, SAWBatch, Trainer, TrainerConfig

INTERRUPT_AT = 2
"""Steps done when rank 1 is interrupted."""


@dataclass(frozen=True, kw_only=True)
class InterruptedLoss(WeightedNLL):
    """`WeightedNLL` that raises KeyboardInterrupt once `steps_done()` reaches `INTERRUPT_AT`."""

    steps_done: Callable[[], int]

    def __call__(self, inputs: LossInputs) -> LossOutput:
        if self.steps_done() == INTERRUPT_AT:
            raise KeyboardInterrupt
        return WeightedNLL.__call__(self, inputs)


class InterruptedWhileWaiting(ListSource):
    """On rank 1, the third batch: a Ctrl-C arrives while the loop waits for it."""

    def __init__(self, batches: list[SAWBatch], rank: int) -> None:
        super().__init__(batches)
        self.rank = rank

    async def next_batch(self) -> SAWBatch:
        if self.rank == 1 and self.position == INTERRUPT_AT:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            await asyncio.sleep(120)  # waiting for samples; the Ctrl-C ends it
        return await super().next_batch()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # as the `ludic` command's handler does


def _name(error: BaseException | None) -> str | None:
    return None if error is None else type(error).__name__


def main() -> None:
    out_dir = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "loss"
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    trainers: list[Trainer] = []
    algorithm = ALGORITHM
    if rank == 1:
        loss = InterruptedLoss(steps_done=lambda: trainers[0].step)
        algorithm = RLAlgorithm(name="test", credit_assigner=ALGORITHM.credit_assigner, loss=loss)
    source = ListSource(batches_for(rank, world_size))
    if mode == "await":
        algorithm = ALGORITHM
        source = InterruptedWhileWaiting(batches_for(rank, world_size), rank)
        signal.signal(signal.SIGINT, _raise_interrupt)
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11)
    trainer = Trainer(tiny_llama(seed=0), algorithm, source, config)
    trainers.append(trainer)
    result: dict[str, Any] = {"raised": None, "close_raised": None, "closed_during": None}

    def close() -> None:
        result["closed_during"] = _name(sys.exc_info()[1])
        try:
            trainer.close()
        except BaseException as e:
            result["close_raised"] = _name(e)
            raise

    async def learn() -> None:
        try:
            await trainer.train(4, progress=False)
        finally:
            close()

    try:
        if mode == "await":
            asyncio.run(learn())
        else:
            try:
                trainer.run(4, progress=False)
            finally:
                close()
    except BaseException as e:
        result["raised"] = _name(e.__context__ if result["close_raised"] else e)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
