"""Launched by test_fsdp_publish_nonfinite.py under torchrun (2 gloo ranks). Usage:
`dist_worker_nonfinite.py OUT_DIR`

Every rank trains the tiny Llama sharded with FSDP2, rank 0 holding an `InProcessPublisher`
(to an engine that loads whatever it gets), publishing after every step. Step 1 publishes
version 1. Then an optimizer hook puts a nan into rank 1's shard of `model.norm.weight` only,
and the run goes on: each rank writes OUT_DIR/rank{R}.json with the `NonFiniteWeightsError` it
raised (or none), and rank 0 also the versions its engine loaded. Both ranks then meet at a
barrier (`runtime.close`), which a rank left behind in a collective would never reach.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from dist_worker_common import ALGORITHM, batches_for
from training_fakes import ListSource, tiny_llama

from ludic.distributed import InProcessPublisher
from ludic.inference import NonFiniteWeightsError
from ludic.training import Trainer, TrainerConfig
from ludic.training.parallel import FSDPRuntime

NORM = "model.norm.weight"


class LoadingEngine:
    """Loads whatever it is given (checks nothing), recording each version."""

    def __init__(self) -> None:
        self.loads: list[int | None] = []

    def update_weights(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, *, version: int | None = None
    ) -> int:
        self.loads.append(version)
        return -1 if version is None else version


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    engine = LoadingEngine()
    publisher = InProcessPublisher(engine, verify=False) if rank == 0 else None
    source = ListSource(batches_for(rank, world)[:1])
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11)
    trainer = Trainer(tiny_llama(seed=0), ALGORITHM, source, config, publisher=publisher)
    assert isinstance(trainer.runtime, FSDPRuntime)
    trainer.run(1, progress=False)  # finite: published as version 1

    def diverge(*_: Any) -> None:  # rank 1's shard of the final norm turns nan
        if rank == 1:
            with torch.no_grad():
                shard = trainer.model.get_parameter(NORM).to_local()
                assert shard.numel() > 0
                shard[0] = float("nan")

    trainer.optimizer.register_step_post_hook(diverge)
    result: dict[str, Any] = {"raised": None}
    try:
        trainer.run(2, progress=False)
    except NonFiniteWeightsError as e:
        result["raised"] = {"names": e.names, "message": str(e), "step": trainer.step}
    if rank == 0:
        result["loads"] = engine.loads
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    trainer.close()


if __name__ == "__main__":
    main()
