"""Launched by test_fsdp.py under torchrun (2 gloo ranks). Usage:
`dist_worker_fsdp.py OUT_DIR SINGLE_PROCESS_CHECKPOINT DEVICE` (cpu: gloo, cuda: NCCL)

1. From scratch on each rank's share of the data: 4 steps (checkpoint at step 3), recording
   metrics and the gathered weights and optimizer state after steps 3 and 4.
2. Resume the single-process checkpoint on 2 ranks (1 -> 2): the loaded weights and optimizer
   state, whether loading left the caller's dict alone, then one more step.
3. A nan loss on rank 1 only: every rank's metrics for that step and the next, and whether
   the weights stayed as they were.
Rank 0 writes everything to OUT_DIR/results.pt.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch
from dist_worker_common import ALGORITHM, SENTINEL, SentinelNLL, batches_for, trainer_config
from training_fakes import ListSource, item, mixed_items, tiny_llama

from ludic.training import ConstantCredit, RLAlgorithm, Trainer, read_checkpoint
from ludic.training.parallel import FSDPRuntime


def _gathered(trainer: Trainer) -> dict[str, object]:
    return {
        "weights": trainer.runtime.full_model_state(trainer.model),
        "optimizer": copy.deepcopy(
            trainer.runtime.full_optimizer_state(trainer.model, trainer.optimizer)
        ),
    }


def main() -> None:
    out_dir, single_checkpoint, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    results: dict[str, object] = {}

    # 1. From scratch; the Trainer picks FSDP by itself (WORLD_SIZE=2).
    first = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        _source(),
        trainer_config(out_dir / "ckpt", device=device),
    )
    runtime = first.runtime
    assert isinstance(runtime, FSDPRuntime), type(runtime)
    rank = runtime.rank
    results["history"] = first.run(3, progress=False)
    results["step3"] = _gathered(first)
    results["history"] += first.run(1, progress=False)  # type: ignore[operator]
    results["step4"] = _gathered(first)
    results["sharded"] = all(
        type(p).__name__ == "DTensor" for p in first.model.parameters()
    ) and any(p.to_local().numel() < p.numel() for p in first.model.parameters())  # type: ignore[attr-defined]

    # 2. Resume a single-process checkpoint on 2 ranks (a different initialisation on purpose).
    resumed = Trainer(
        tiny_llama(seed=123),
        ALGORITHM,
        _source(),
        trainer_config(out_dir / "resumed", device=device),
        runtime=runtime,
    )
    results["resumed_step"] = resumed.resume(single_checkpoint)
    results["resumed_position"] = resumed.batch_source.position  # type: ignore[attr-defined]
    results["loaded"] = _gathered(resumed)
    results["resumed_history"] = resumed.run(1, progress=False)
    results["resumed_step4"] = _gathered(resumed)

    # Loading leaves the caller's dict (keys and tensors) as it was.
    state = read_checkpoint(single_checkpoint).model_state if rank == 0 else {}
    before = {k: v.clone() for k, v in state.items()}
    runtime.load_model_state(resumed.model, state)
    results["caller_dict_unchanged"] = state.keys() == before.keys() and all(
        torch.equal(state[k], before[k]) for k in state
    )

    # 3. Only rank 1's loss is nan: both ranks skip, nobody hangs, the next step trains.
    poisoned = [[item(8, weight=SENTINEL)], mixed_items(2, seed=8)]
    clean = [mixed_items(2, seed=9), mixed_items(2, seed=10)]
    guarded = Trainer(
        tiny_llama(seed=0),
        RLAlgorithm(name="nan", credit_assigner=ConstantCredit(value=1.0), loss=SentinelNLL()),
        ListSource([poisoned[1 - rank], clean[rank]]),  # rank 1 gets the sentinel sample
        trainer_config(out_dir / "guarded", device=device),
        runtime=runtime,
    )
    initial = runtime.full_model_state(guarded.model)
    history = guarded.run(1, progress=False)
    after_nan = runtime.full_model_state(guarded.model)
    results["nan_unchanged"] = all(torch.equal(initial[k], after_nan[k]) for k in initial)
    history += guarded.run(1, progress=False)
    results["nan_histories"] = runtime.all_gather_object(history)

    if rank == 0:
        torch.save(results, out_dir / "results.pt")
    first.close()


def _source() -> ListSource:
    """This rank's share (torchrun sets RANK and WORLD_SIZE before the group exists)."""
    return ListSource(batches_for(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])))


if __name__ == "__main__":
    main()
