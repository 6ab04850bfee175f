"""Launched by test_fsdp_resume_publish.py under torchrun (2 gloo ranks). Usage:
`dist_worker_resume_publish.py OUT_DIR CHECKPOINT_ROOT`

Resumes a single-process checkpoint root on 2 ranks, with a publisher on rank 0 only (as the
learner builds it), then trains one step. Resume gathers the sharded weights on every rank and
rank 0 publishes them: the versions and the first published weights go to OUT_DIR/results.pt.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch
from dist_worker_common import ALGORITHM, batches_for, trainer_config
from training_fakes import ListSource, tiny_llama

from ludic.training import Trainer
from ludic.training.parallel import FSDPRuntime


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[tuple[int, dict[str, torch.Tensor]]] = []

    def publish(
        self, weights: torch.nn.Module | Mapping[str, torch.Tensor], *, version: int
    ) -> None:
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        self.published.append((version, {k: v.detach().clone() for k, v in state.items()}))


def main() -> None:
    out_dir, root = Path(sys.argv[1]), Path(sys.argv[2])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    publisher = RecordingPublisher() if rank == 0 else None
    trainer = Trainer(
        tiny_llama(seed=123),  # another init: the published weights must be the checkpoint's
        ALGORITHM,
        ListSource(batches_for(rank, world_size)),
        trainer_config(out_dir / "ckpt"),
        publisher=publisher,
    )
    assert isinstance(trainer.runtime, FSDPRuntime), type(trainer.runtime)
    step = trainer.resume(root)
    trainer.run(1, progress=False)
    if publisher is not None:
        versions = [version for version, _ in publisher.published]
        torch.save(
            {"step": step, "versions": versions, "weights": publisher.published[0][1]},
            out_dir / "results.pt",
        )
    trainer.close()


if __name__ == "__main__":
    main()
