"""Launched by test_credit_check_ranks.py under torchrun (2 gloo ranks): each rank checks the
samples it would read with `CreditCheck(quiet=rank != 0)`, as `ludic learner` does, and calls
`say_held` after each step with the group's `all_gather_object`. Every line each rank logs is
printed as `rank R: LEVEL: line`, and each refusal as `rank R: refused: message`, for the test
to read. Its argument picks what the ranks read: `notices` (samples that need a notice, some
read by rank 1 only) or `records` (two actors' differing records, each read by one rank)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

import torch.distributed as dist
from pipeline_fakes import sample

from ludic.pipeline.credit_check import CreditCheck, CreditMismatchError, RankCredit, credit_record
from ludic.recipes.algorithms import GiGPOOptions


def say(line: str) -> None:
    """One line in one write: both ranks share torchrun's stdout, and print's separate writes
    of the text and its newline interleaved there ('rank 0: donerank 1: done')."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def _from(actor: str, record: dict[str, Any] | None) -> Any:
    item = sample()
    meta = {**item.meta, "actor_id": actor}
    if record is not None:
        meta["credit"] = record
    return dataclasses.replace(item, meta=meta)


def _all_gather(shared: RankCredit) -> list[RankCredit]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, shared)
    return out


class _Print(logging.Handler):
    def __init__(self, rank: int) -> None:
        super().__init__(logging.INFO)
        self.rank = rank

    def emit(self, record: logging.LogRecord) -> None:
        say(f"rank {self.rank}: {record.levelname}: {record.getMessage()}")


def _notices(rank: int) -> None:
    grpo, old = credit_record("grpo"), None
    # STEPS[step][rank]: the samples each rank reads. Both ranks see a recorded sample first;
    # only rank 1 sees one from an actor that records nothing, until step 2, when both do.
    steps = [
        [[_from("a", grpo)], [_from("b", grpo), _from("old", old)]],
        [[_from("old", old)], [_from("old", old)]],
    ]
    check = CreditCheck("grpo", quiet=rank != 0)
    for step in steps:
        for item in step[rank]:
            check(item)
        check.say_held(_all_gather)
    # dr_grpo samples without their --max-tokens on both ranks in the same step: said once
    dr_grpo = CreditCheck("dr_grpo", max_tokens=64, quiet=rank != 0)
    dr_grpo(_from("c", credit_record("dr_grpo") | {"flags": {}}))
    dr_grpo.say_held(_all_gather)


def _records(rank: int) -> None:
    """Actor g0 (--gigpo.gamma 0.95) reaches rank 0 only, g1 (0.9) rank 1 only."""
    check = CreditCheck("gigpo", quiet=rank != 0)
    gamma = 0.95 if rank == 0 else 0.9
    check(_from(f"g{rank}", credit_record("gigpo", GiGPOOptions(gamma=gamma))))
    try:
        check.say_held(_all_gather)
    except CreditMismatchError as e:
        say(f"rank {rank}: refused: {e}")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    log = logging.getLogger("ludic.pipeline.credit_check")
    log.setLevel(logging.INFO)
    log.addHandler(_Print(rank))
    {"notices": _notices, "records": _records}[sys.argv[1]](rank)
    say(f"rank {rank}: done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
