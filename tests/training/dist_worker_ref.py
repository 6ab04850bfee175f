"""Run by dist_worker_lockstep.py (launched by test_fsdp_lockstep.py under torchrun, 2 gloo
ranks), `run_reference(OUT_DIR, plain|shared|packed, runtime)`:

GRPO with a KL term to a reference model that is itself FSDP2-sharded
(`shard_model(frozen=True)`), so every reference forward all-gathers its weights, on data
where the ranks are uneven: a rank with no samples and ranks with different micro-batch
counts (`plain`: dist_worker_common's steps), or with shared prompts on one rank only and
dummy passes on the shared path (`shared`:
dist_worker_shared_prefix's mismatch steps, `TrainerConfig(shared_prefix=True)`; `packed`: the
same with packing on and no gradient clipping). Every rank
must make the same reference calls as well as the same policy calls, or the job hangs.

Rank 0 writes the step metrics, the gathered policy weights and each rank's count of
reference forwards to OUT_DIR/results.pt. Also imported by the tests for the data and config.
"""

from __future__ import annotations

from pathlib import Path

import torch
from training_fakes import ListSource, tiny_llama

from ludic.rollouts.samples import SAWItem
from ludic.training import ConstantCredit, RLAlgorithm, Trainer, TrainerConfig, make_grpo
from ludic.training.parallel import shard_model
from ludic.training.parallel.runtime import TrainingRuntime

REF_SEED = 7
ALGORITHM = RLAlgorithm(
    name="grpo_kl",
    credit_assigner=ConstantCredit(value=1.0),
    loss=make_grpo(kl_beta=0.5).loss,
)


def steps_for(mode: str, rank: int, world_size: int) -> list[list[SAWItem]]:
    if mode == "plain":
        from dist_worker_common import batches_for

        return batches_for(rank, world_size)
    from dist_worker_shared_prefix import batches_for as shared_batches

    return shared_batches(rank, world_size, mismatch=True)


def config(mode: str) -> TrainerConfig:
    """`packed`: the shared-prefix data packed into one row per micro-batch, no clipping."""
    return TrainerConfig(
        lr=5e-3,
        micro_batch_tokens=32 if mode == "plain" else 40,
        max_grad_norm=None if mode == "packed" else 0.5,
        seed=11,
        shared_prefix=mode != "plain",
        packing=mode == "packed",
    )


def run_reference(out_dir: Path, mode: str, runtime: TrainingRuntime) -> None:
    """`mode`'s run on this rank, in `runtime` (torchrun's group, so the reference can be
    sharded); rank 0 writes OUT_DIR/results.pt."""
    steps = steps_for(mode, runtime.rank, runtime.world_size)
    ref = shard_model(tiny_llama(seed=REF_SEED), frozen=True)  # same weights on every rank
    ref_calls: list[int] = []
    ref.register_forward_pre_hook(lambda *_: ref_calls.append(1))
    trainer = Trainer(
        tiny_llama(seed=0),
        ALGORITHM,
        ListSource(steps),
        config(mode),
        ref_model=ref,
        runtime=runtime,
    )
    history = trainer.run(len(steps), progress=False)
    weights = trainer.runtime.full_model_state(trainer.model)
    counts = trainer.runtime.all_gather_object(len(ref_calls))
    # frozen=True: the root's weights (embeddings, head) are sharded again after forward too
    sharded = all(type(p).__name__ == "DTensor" for p in ref.parameters())
    if runtime.rank == 0:
        results = {"history": history, "weights": weights, "ref_calls": counts, "sharded": sharded}
        torch.save(results, out_dir / "results.pt")
    trainer.close()
