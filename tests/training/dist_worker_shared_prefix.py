"""Launched by test_shared_prefix.py under torchrun (2 gloo ranks). Usage:
`dist_worker_shared_prefix.py OUT_DIR [mismatch]`

`mismatch` trains on data where, in the same pass, one rank has a group sharing a prompt and
the other has none (rows sharing nothing, or only dummy passes): the ranks must still make the
same model calls (FSDP2 gathers weights per call) instead of hanging.

FSDP2 training on groups that share prompts, with `TrainerConfig(shared_prefix=True)` (two model
calls per micro-batch, gradients through the prefix's KV cache): 2 steps on each rank's share.
Rank 0 writes the gathered weights, the step metrics and how often each rank ran the shared
path to OUT_DIR/results.pt. Also imported by the test for the same data and config.
"""

from __future__ import annotations

import faulthandler
import os
import random
import sys
from pathlib import Path
from typing import Any

import torch
from training_fakes import VOCAB, ListSource, WeightedNLL, tiny_llama

from ludic.rollouts.samples import SAWItem
from ludic.training import ConstantCredit, RLAlgorithm, Trainer, TrainerConfig
from ludic.training import shared_prefix as shared_prefix_module

ALGORITHM = RLAlgorithm(name="nll", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())


def _group(seed: int, rows: int, prompt: int) -> list[SAWItem]:
    rng = random.Random(seed)
    head = [rng.randrange(1, VOCAB) for _ in range(prompt)]
    items = []
    for i in range(rows):
        tail = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(2, 9))]
        mask = (0,) * prompt + (1,) * len(tail)
        items.append(
            SAWItem(input_ids=(*head, *tail), action_mask=mask, weight=rng.uniform(-1, 1) + 0.1 * i)
        )
    return items


# STEP_BATCHES[step][rank]: groups of 2-5 rows with prompts of 9-12 tokens, a row sharing
# nothing, and a group (step 2, rank 1) over the micro-batch budget, split in runs.
STEP_BATCHES: list[list[list[SAWItem]]] = [
    [_group(1, 4, 10), _group(2, 3, 12) + _group(3, 1, 9)],
    [_group(4, 2, 9) + _group(5, 3, 11), _group(6, 5, 12)],
]


def _unrelated(seed: int, rows: int, prompt: int) -> list[SAWItem]:
    """Rows whose prompts share nothing."""
    return [item for i in range(rows) for item in _group(seed * 100 + i, 1, prompt)]


# MISMATCH_STEPS[step][rank]: step 1, rank 0 shares a 12-token prompt and rank 1 shares
# nothing; step 2, rank 0 has 2 micro-batches of groups while rank 1 has one row (its second
# pass is a dummy one); step 3, the other way round.
MISMATCH_STEPS: list[list[list[SAWItem]]] = [
    [_group(11, 3, 12), _unrelated(12, 3, 12)],
    [_group(13, 3, 12) + _group(14, 3, 11), _unrelated(15, 1, 10)],
    [_unrelated(16, 1, 9), _group(17, 3, 12) + _group(18, 2, 10)],
]


def batches_for(rank: int, world_size: int, *, mismatch: bool = False) -> list[list[SAWItem]]:
    steps = MISMATCH_STEPS if mismatch else STEP_BATCHES
    if world_size == 1:
        return [[item for share in step for item in share] for step in steps]
    return [step[rank] for step in steps]


def config(shared_prefix: bool) -> TrainerConfig:
    return TrainerConfig(
        lr=5e-3, micro_batch_tokens=40, max_grad_norm=0.5, seed=11, shared_prefix=shared_prefix
    )


HANG_S = 150.0
"""A rank still running after this long is hung in a collective: it dumps its stack and exits
(torchrun's workers run in sessions of their own, which the test's kill does not reach)."""


def main() -> None:
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    out_dir = Path(sys.argv[1])
    mismatch = sys.argv[2:] == ["mismatch"]
    calls: list[int] = []
    real = shared_prefix_module.shared_prefix_logprobs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    shared_prefix_module.shared_prefix_logprobs = counted  # type: ignore[assignment]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    source = ListSource(batches_for(rank, world, mismatch=mismatch))
    trainer = Trainer(tiny_llama(seed=0), ALGORITHM, source, config(True))
    history = trainer.run(len(MISMATCH_STEPS if mismatch else STEP_BATCHES), progress=False)
    weights = trainer.runtime.full_model_state(trainer.model)
    counts = trainer.runtime.all_gather_object(len(calls))
    sharded = type(next(trainer.model.parameters())).__name__ == "DTensor"
    if rank == 0:
        results = {"history": history, "weights": weights, "calls": counts, "sharded": sharded}
        torch.save(results, out_dir / "results.pt")
    trainer.close()


if __name__ == "__main__":
    main()
