"""Launched by test_lora.py under torchrun (2 gloo ranks). Usage:
`dist_worker_lora.py OUT_DIR SINGLE_PROCESS_CHECKPOINT`

1. LoRA from scratch on each rank's share: 3 steps (adapter checkpoint at step 2), publishing
   merged weights every step to a recorder on rank 0; the gathered state after step 2.
2. Resume the single-process adapter checkpoint on 2 ranks (1 -> 2): the gathered state.
Rank 0 writes everything to OUT_DIR/results.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from dist_worker_common import ALGORITHM, batches_for, lora_model, trainer_config
from training_fakes import ListSource

from ludic.distributed import Weights
from ludic.training import Trainer


class Recorder:
    """A PolicyPublisher that keeps a copy of every published state dict."""

    def __init__(self) -> None:
        self.published: list[tuple[int, dict[str, torch.Tensor]]] = []

    def publish(self, weights: Weights, *, version: int) -> None:
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.published.append((version, {k: v.detach().clone() for k, v in state.items()}))


def _source() -> ListSource:
    return ListSource(batches_for(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])))


def main() -> None:
    out_dir, single_checkpoint = Path(sys.argv[1]), Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    recorder = Recorder() if rank == 0 else None  # only rank 0 has a publisher
    first = Trainer(
        lora_model(seed=0),
        ALGORITHM,
        _source(),
        trainer_config(out_dir / "ckpt", every_n_steps=2),
        publisher=recorder,
    )
    results: dict[str, object] = {"history": first.run(2, progress=False)}
    results["step2"] = first.runtime.full_model_state(first.model)
    results["history"] += first.run(1, progress=False)  # type: ignore[operator]

    resumed = Trainer(
        lora_model(seed=5),
        ALGORITHM,
        _source(),
        trainer_config(out_dir / "resumed", every_n_steps=2),
        runtime=first.runtime,
    )
    results["resumed_step"] = resumed.resume(single_checkpoint)
    results["loaded"] = resumed.runtime.full_model_state(resumed.model)
    if rank == 0:
        assert recorder is not None
        results["published"] = recorder.published
        torch.save(results, out_dir / "results.pt")
    first.close()


if __name__ == "__main__":
    main()
