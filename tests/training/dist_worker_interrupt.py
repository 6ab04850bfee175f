"""Launched by test_interrupted_rank_close.py under torchrun (2 gloo ranks). Usage:
`dist_worker_interrupt.py OUT_DIR`

Every rank trains the tiny Llama sharded with FSDP2, as a user's script does (the Trainer in
`try/finally: trainer.close()`). In the third step (rank 1 has samples there) a Ctrl-C lands
in rank 1's Python (its loss raises KeyboardInterrupt, as the signal handler does) while rank
0 has gone on into the backward's collectives, as when torchrun passes a Ctrl-C on to its
workers. Each rank writes OUT_DIR/rank{R}.json once its `trainer.close()` has returned or
raised: what the run raised and what `close()` raised (None when nothing). A rank left waiting
writes nothing and the test's timeout fails it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dist_worker_common import ALGORITHM, batches_for
from training_fakes import ListSource, WeightedNLL, tiny_llama

from ludic.training import LossInputs, LossOutput, RLAlgorithm, Trainer, TrainerConfig

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


def _name(error: BaseException | None) -> str | None:
    return None if error is None else type(error).__name__


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    trainers: list[Trainer] = []
    algorithm = ALGORITHM
    if rank == 1:
        loss = InterruptedLoss(steps_done=lambda: trainers[0].step)
        algorithm = RLAlgorithm(name="test", credit_assigner=ALGORITHM.credit_assigner, loss=loss)
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11)
    trainer = Trainer(
        tiny_llama(seed=0), algorithm, ListSource(batches_for(rank, world_size)), config
    )
    trainers.append(trainer)
    result: dict[str, Any] = {"raised": None, "close_raised": None}
    try:
        try:
            trainer.run(4, progress=False)
        finally:
            try:
                trainer.close()
            except BaseException as e:
                result["close_raised"] = _name(e)
                raise
    except BaseException as e:
        result["raised"] = _name(e.__context__ if result["close_raised"] else e)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
