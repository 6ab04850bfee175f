"""Launched by test_fsdp_reference.py under torchrun (2 gloo ranks). Usage:
`dist_worker_ref_auto.py OUT_DIR ref|eval`

`ref`: each rank passes the Trainer a plain (unsharded) reference model, a copy of a policy
whose random initialisation differs per rank (as an unseeded start does), under GRPO with a
KL term on uneven ranks (dist_worker_common's steps). The Trainer must shard it itself, frozen,
from rank 0's weights (the policy's start, as `prepare_model` broadcasts it), so the first
step's KL is 0 on both ranks and the run matches one process. Then a reference the caller
sharded already (`shard_model(ref, frozen=True)`) must be kept as it is, not sharded again.

`eval`: an `eval_fn` that runs the trainer's (sharded) model forward on held-out samples,
given to every rank, a logger on rank 0 only; then an `eval_fn`, and apart from it a
reference model, given to rank 0 only, which must fail on both ranks with a clear error
instead of leaving rank 1 waiting in the next collective forever.

Rank 0 writes what it saw to OUT_DIR/results.pt. Also imported by the test for the data.
"""

from __future__ import annotations

import copy
import faulthandler
import os
import sys
from pathlib import Path
from typing import Any

import torch
from dist_worker_common import ALGORITHM as NLL
from dist_worker_common import batches_for
from dist_worker_ref import ALGORITHM, REF_SEED, config
from training_fakes import ListSource, mixed_items, tiny_llama

from ludic.training import JsonlLogger, Trainer, TrainerConfig, collate
from ludic.training.logprobs import sequence_logprobs
from ludic.training.parallel import TrainingRuntime, auto_runtime, is_sharded, shard_model

HANG_S = 60.0
"""A rank still running after this long is hung in a collective: it dumps its stack and exits."""
RANK_SEED_STEP = 100
"""Rank r's policy starts from tiny_llama(seed=r * RANK_SEED_STEP): rank 0's is seed 0."""
EVAL_EVERY = 2


def held_out_eval(trainer: Trainer) -> dict[str, float]:
    """Mean action-token logprob of fixed held-out samples under the trainer's model (a
    forward of the sharded model on every rank)."""
    batch = collate(mixed_items(4, seed=99))
    with torch.no_grad():
        logprobs_BT, _ = sequence_logprobs(trainer.model, batch)
    mask_BT = batch.action_mask_BT
    return {"logprob": float((logprobs_BT * mask_BT).sum() / mask_BT.sum())}


def eval_config() -> TrainerConfig:
    return TrainerConfig(lr=5e-3, micro_batch_tokens=32, seed=11, eval_every=EVAL_EVERY)


def _local_numel(param: torch.Tensor) -> int:
    """This rank's share of `param` (all of it unless sharded)."""
    return int(param.to_local().numel()) if hasattr(param, "to_local") else param.numel()


def _reference_runs(rank: int) -> dict[str, Any]:
    """The way a user writes it: no runtime given, no group joined before the Trainer."""
    steps = batches_for(rank, 2)
    policy = tiny_llama(seed=rank * RANK_SEED_STEP)
    ref_calls: list[int] = []
    ref = copy.deepcopy(policy)  # plain, and unlike the other rank's
    ref.register_forward_pre_hook(lambda *_: ref_calls.append(1))
    trainer = Trainer(policy, ALGORITHM, ListSource(steps), config("plain"), ref_model=ref)
    runtime = trainer.runtime
    history = trainer.run(len(steps), progress=False)
    held = trainer.ref_model
    assert held is not None
    out = {
        "history": history,
        "weights": trainer.runtime.full_model_state(trainer.model),
        "ref_calls": runtime.all_gather_object(len(ref_calls)),
        "ref_sharded": runtime.all_gather_object(is_sharded(held)),
        "ref_frozen": not any(p.requires_grad for p in held.parameters()) and not held.training,
        "ref_local_numel": sum(_local_numel(p) for p in held.parameters()),
        "ref_numel": sum(p.numel() for p in tiny_llama().parameters()),
    }

    presharded = shard_model(tiny_llama(seed=REF_SEED), frozen=True)
    params = [id(p) for p in presharded.parameters()]
    kept = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        ListSource(steps),
        config("plain"),
        ref_model=presharded,
        runtime=runtime,
    )
    kept.run(1, progress=False)
    out["presharded_kept"] = runtime.all_gather_object(
        kept.ref_model is presharded and params == [id(p) for p in presharded.parameters()]
    )
    trainer.close()  # the group it joined
    return out


def _error(build: Any) -> str | None:
    try:
        build()
    except ValueError as e:
        return str(e)
    return None


def _eval_runs(rank: int, runtime: TrainingRuntime, out_dir: Path) -> dict[str, Any]:
    steps = [mixed_items(3, seed=1 + rank), mixed_items(2, seed=5 + rank)] * 2
    trainer = Trainer(
        tiny_llama(seed=0),
        NLL,
        ListSource(steps),
        eval_config(),
        eval_fn=held_out_eval,
        logger=JsonlLogger(out_dir / "metrics.jsonl") if rank == 0 else None,
        runtime=runtime,
    )
    history = trainer.run(len(steps), progress=False)
    trainer.close()
    main_only = rank == 0
    eval_error = _error(
        lambda: Trainer(
            tiny_llama(seed=0),
            NLL,
            ListSource(steps),
            eval_config(),
            eval_fn=held_out_eval if main_only else None,
            runtime=runtime,
        ).run(EVAL_EVERY, progress=False)
    )
    ref_error = _error(
        lambda: Trainer(
            tiny_llama(seed=0),
            NLL,
            ListSource(steps),
            config("plain"),
            ref_model=tiny_llama(seed=REF_SEED) if main_only else None,
            runtime=runtime,
        ).run(1, progress=False)
    )
    return {
        "history": history,
        "eval_error": runtime.all_gather_object(eval_error),
        "ref_error": runtime.all_gather_object(ref_error),
    }


def main() -> None:
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    out_dir, mode = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK"])
    if mode == "ref":
        results = _reference_runs(rank)
    else:
        runtime = auto_runtime()
        results = _eval_runs(rank, runtime, out_dir)
        runtime.close()
    if rank == 0:
        torch.save(results, out_dir / "results.pt")


if __name__ == "__main__":
    main()
