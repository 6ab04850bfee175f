"""Launched by test_fsdp_lockstep.py under torchrun (2 gloo ranks). Usage:
`dist_worker_lockstep.py OUT_DIR [REF_MODE ...]`

First each REF_MODE's run with a sharded reference model (dist_worker_ref.run_reference, into
OUT_DIR/REF_MODE/results.pt), then, in the same group (a torchrun start costs more than a run):

1. Uneven data ends: rank 0's batch source is exhausted after 1 batch, rank 1's after 2 (an
   offline shard per rank with a different size). Every rank must stop after step 1: a rank
   that went on alone would wait in the step's first all-reduce forever.
2. Batch-invariant mode on an FSDP2-sharded model, which it does not support: every rank must
   get the same clear error before any weight gather (a rank with no samples would otherwise
   sit in its dummy pass's all-gather while the other failed).
3. A checkpoint manager given to rank 0 only: a clear error on every rank.
4. Rank 1's batch source fails (its Redis went away, say) on the second batch while rank 0's
   has more: rank 1 raises its error, rank 0 a RankFailedError naming rank 1 and the cause,
   instead of waiting in the step's all-reduce forever.
Rank 0 writes every rank's results to OUT_DIR/results.pt. Between runs the ranks check that
they are at the same one (a run that left their collectives out of step stops the launch).
Each run gets `HANG_S`: a rank still in it after that is hung in a collective, and dumps its
stack and exits.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import torch
from dist_worker_common import ALGORITHM
from dist_worker_ref import run_reference
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.rollouts.samples import SAWItem
from ludic.training import (
    BatchSourceExhausted,
    CheckpointConfig,
    CheckpointManager,
    SAWBatch,
    Trainer,
    TrainerConfig,
)
from ludic.training.parallel import auto_runtime
from ludic.training.parallel.runtime import TrainingRuntime

HANG_S = 100.0
"""A rank still in one run after this long is hung in a collective: it dumps its stack and exits."""


class ShortSource(ListSource):
    """`ListSource` that is exhausted after its batches (no cycling)."""

    async def next_batch(self) -> SAWBatch:
        if self.position >= len(self.batches):
            raise BatchSourceExhausted(f"all {len(self.batches)} batches served")
        return await super().next_batch()


class FailingSource(ListSource):
    """`ListSource` whose fetches fail after its batches (a lost connection)."""

    async def next_batch(self) -> SAWBatch:
        if self.position >= len(self.batches):
            raise ConnectionError("lost the stream")
        return await super().next_batch()


def _config(**overrides: object) -> TrainerConfig:
    return TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11, **overrides)  # type: ignore[arg-type]


def _in_step(runtime: TrainingRuntime, run: str) -> None:
    """Fails unless every rank is at `run`; then starts `run`'s `HANG_S`."""
    at = runtime.all_gather_object(run)
    if at != [run] * runtime.world_size:
        raise SystemExit(f"rank {runtime.rank}: the ranks are out of step at {run!r}: {at}")
    faulthandler.dump_traceback_later(HANG_S, exit=True)


def main() -> None:
    out_dir, ref_modes = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ["RANK"])
    runtime = auto_runtime()
    for mode in ref_modes:
        _in_step(runtime, mode)
        (out_dir / mode).mkdir(exist_ok=True)
        run_reference(out_dir / mode, mode, runtime)
    _in_step(runtime, "lockstep")
    results: dict[str, object] = {}

    steps: list[list[SAWItem]] = [mixed_items(3, seed=1 + rank), mixed_items(2, seed=5 + rank)]
    uneven = Trainer(
        tiny_llama(seed=0), ALGORITHM, ShortSource(steps[: rank + 1]), _config(), runtime=runtime
    )
    history = uneven.run(5, progress=False)
    results["exhausted"] = {
        "steps": len(history),
        "trainer_step": uneven.step,
        "policy_version": uneven.policy_version,
    }

    invariant = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        ListSource([steps[0] if rank == 0 else []]),  # rank 1 would run a dummy pass
        _config(batch_invariant=True),
        runtime=runtime,
    )
    try:
        invariant.run(1, progress=False)
        results["invariant_error"] = None
    except ValueError as error:
        results["invariant_error"] = str(error)

    # 3. A checkpoint manager on rank 0 only (rank 0 writes checkpoints, but every rank
    #    gathers the state): refused on every rank when the Trainer is built.
    manager = CheckpointManager(CheckpointConfig(dir=str(out_dir / "ckpt"))) if rank == 0 else None
    try:
        Trainer(
            tiny_llama(seed=0),
            ALGORITHM,
            ListSource(steps),
            _config(),
            checkpoint_manager=manager,
            runtime=runtime,
        )
        results["checkpoint_error"] = None
    except ValueError as error:
        results["checkpoint_error"] = str(error)

    source = FailingSource(steps[:1]) if rank == 1 else ListSource(steps)
    failing = Trainer(tiny_llama(seed=0), ALGORITHM, source, _config(), runtime=runtime)
    try:
        failing.run(5, progress=False)
        results["failed_error"] = None
    except Exception as error:
        results["failed_error"] = f"{type(error).__name__}: {error}"
    results["failed_step"] = failing.step

    gathered = runtime.all_gather_object(results)
    if rank == 0:
        torch.save(gathered, out_dir / "results.pt")
    runtime.close()


if __name__ == "__main__":
    main()
