"""Launched by test_fsdp_progress.py under torchrun (2 gloo ranks): two steps with the
progress bar on, as `ludic train` runs them on every rank. Usage: `dist_worker_progress.py`."""

from __future__ import annotations

import os

from dist_worker_common import ALGORITHM, batches_for
from training_fakes import ListSource, tiny_llama

from ludic.training import Trainer, TrainerConfig


def main() -> None:
    source = ListSource(batches_for(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])))
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32)
    trainer = Trainer(tiny_llama(seed=0), ALGORITHM, source, config)
    try:
        trainer.run(2, progress=True)
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
