"""Launched by test_fsdp_credit_ranks.py under torchrun (2 gloo ranks). Usage:
`dist_worker_credit_ranks.py OUT_DIR MODE [MODE ...]`

Every rank trains the tiny Llama sharded with FSDP2 for 2 steps on a batch source that checks
each sample's credit record with a `CreditCheck` (quiet on rank 1) and compares the ranks'
first records in `check_ranks`, as the pipeline learner's source does:

- `agree`: both ranks read samples of actors crediting with --gigpo.gamma 0.95;
- `differ`: actor g0 (--gigpo.gamma 0.95) reaches rank 0 only, g1 (0.9) rank 1 only.

Each mode has its own Trainer in the one launch. Every rank writes OUT_DIR/MODE/rank{R}.json:
what it raised (type, message; None when nothing), the trainer's step and policy version and
whether the optimizer ever stepped (it holds state). A rank left waiting in a collective
writes nothing and the test's timeout fails it. Lines go to stdout with one `os.write` each
(both ranks share torchrun's stdout).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from dist_worker_common import ALGORITHM
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.pipeline.credit_check import CreditCheck, credit_record
from ludic.recipes.algorithms import GiGPOOptions
from ludic.training import SAWBatch, Trainer, TrainerConfig
from ludic.training.parallel.fsdp import init_process_group_from_env


def say(line: str) -> None:
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


class CreditCheckedListSource(ListSource):
    """`ListSource` whose samples pass `check` as they are served (as the pipeline source's
    `check_sample`), and whose ranks compare their first records in `check_ranks`."""

    def __init__(self, batches: list[list[Any]], check: CreditCheck) -> None:
        super().__init__(batches)
        self.check = check

    async def next_batch(self) -> SAWBatch:
        batch = await super().next_batch()
        for item in batch.items:
            self.check(item)
        return batch

    def check_ranks(self, all_gather: Callable[[Any], list[Any]]) -> None:
        self.check.say_held(all_gather)


def _batches(rank: int, gamma: float) -> list[list[Any]]:
    """Two batches of actor `g<rank>`'s samples, credited with --gigpo.gamma `gamma`."""
    meta = {"actor_id": f"g{rank}", "credit": credit_record("gigpo", GiGPOOptions(gamma=gamma))}
    return [
        [dataclasses.replace(item, meta={**item.meta, **meta}) for item in batch]
        for batch in (mixed_items(3, seed=1 + rank), mixed_items(2, seed=5 + rank))
    ]


def _run_mode(out_dir: Path, mode: str, rank: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    gamma = {"agree": 0.95, "differ": 0.95 if rank == 0 else 0.9}[mode]
    source = CreditCheckedListSource(_batches(rank, gamma), CreditCheck("gigpo", quiet=rank != 0))
    config = TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11)
    trainer = Trainer(tiny_llama(seed=0), ALGORITHM, source, config)
    result: dict[str, Any] = {"raised": None}
    try:
        trainer.run(2, progress=False)
    except Exception as e:
        result["raised"] = {"type": type(e).__name__, "message": str(e)}
    finally:
        result |= {
            "step": trainer.step,
            "policy_version": trainer.policy_version,
            "optimizer_stepped": bool(trainer.optimizer.state),
        }
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
        trainer.close()


def main() -> None:
    out_dir, modes = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ["RANK"])
    init_process_group_from_env()  # one group for every mode: each Trainer joins it
    for mode in modes:
        say(f"rank {rank}: mode {mode}")
        _run_mode(out_dir / mode, mode, rank)
        dist.barrier()
    dist.destroy_process_group()
    say(f"rank {rank}: done")


if __name__ == "__main__":
    main()
