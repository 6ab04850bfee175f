"""Under torchrun each pipeline learner rank checks the credit records of the samples it reads,
and the ranks compare their first records: two actors that disagree and whose samples reached
only different ranks were refused one step late, after the learner compared them at the end
of a step that had already trained on the mixed credit. The Trainer now calls a batch source's
`check_ranks` on every rank right after the batch is fetched, before the optimizer step, and
every rank refuses alike (2 gloo ranks, FSDP2)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dist_worker_common import torchrun_exit

from ludic.training.parallel import RankCheckedSource, check_batch_together
from ludic.training.parallel.runtime import LocalRuntime

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

REFUSED = (
    "actors on this stream assign credit differently: 'g0' (read by learner rank 0) with "
    "--algorithm gigpo --gigpo.gamma 0.95, 'g1' (read by learner rank 1) with --algorithm "
    "gigpo --gigpo.gamma 0.9: run every actor of a stream with the same --algorithm and "
    "--gigpo.* flags"
)


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, dict[str, Any]]]:
    """Each mode's result on each rank (one torchrun launch runs both modes)."""
    out = tmp_path_factory.mktemp("credit-ranks")
    code, output = torchrun_exit("dist_worker_credit_ranks.py", str(out), "agree", "differ")
    assert code == 0, output[-6000:]
    return {
        mode: {r: json.loads((out / mode / f"rank{r}.json").read_text()) for r in (0, 1)}
        for mode in ("agree", "differ")
    }


def test_ranks_that_read_differently_credited_samples_refuse_before_training(
    outcome: dict[str, dict[int, dict[str, Any]]],
) -> None:
    for rank, result in outcome["differ"].items():
        assert result["raised"] == {"type": "CreditMismatchError", "message": REFUSED}, rank
        # refused before the first optimizer step: nothing trained on the mixed credit
        assert (result["step"], result["policy_version"], result["optimizer_stepped"]) == (
            0,
            0,
            False,
        ), rank


def test_ranks_that_agree_train_every_step(
    outcome: dict[str, dict[int, dict[str, Any]]],
) -> None:
    for rank, result in outcome["agree"].items():
        assert result == {
            "raised": None,
            "step": 2,
            "policy_version": 2,
            "optimizer_stepped": True,
        }, rank


class _Gathered:
    """A `RankCheckedSource` that records what its check was handed."""

    def __init__(self) -> None:
        self.gathered: list[list[Any]] = []

    async def next_batch(self) -> Any:
        raise AssertionError("not fetched here")

    def check_ranks(self, all_gather: Any) -> None:
        self.gathered.append(all_gather("mine"))


def test_one_process_checks_with_its_own_share_only() -> None:
    source = _Gathered()
    assert isinstance(source, RankCheckedSource)
    check_batch_together(LocalRuntime(), source, "checking the batch of step 1")
    assert source.gathered == [["mine"]]
    check_batch_together(LocalRuntime(), object(), "checking a source without the hook")
