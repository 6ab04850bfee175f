"""Launched by test_lora_reference.py under torchrun (2 gloo ranks). Usage:
`dist_worker_lora_reference.py OUT_DIR`

GRPO with a KL term on a sharded LoRA policy whose reference is its own base (adapters
disabled, no copy), on dist_worker_common's uneven steps (a rank with no samples runs dummy
passes, reference forwards included). Rank 0 writes the step metrics to OUT_DIR/results.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from dist_worker_common import batches_for, lora_model
from dist_worker_ref import ALGORITHM, config
from training_fakes import ListSource

from ludic.training import Trainer


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = lora_model()
    trainer = Trainer(
        model,
        ALGORITHM,
        ListSource(batches_for(rank, world_size)),
        config("plain"),
        ref_model=model.get_base_model(),
    )
    try:
        history = trainer.run(4, progress=False)
        if rank == 0:
            same = trainer.ref_model is trainer.model
            torch.save({"history": history, "no_copy": same}, out_dir / "results.pt")
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
