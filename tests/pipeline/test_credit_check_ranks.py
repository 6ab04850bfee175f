"""Under torchrun every learner rank checks the samples it reads, and `CreditCheck(quiet=True)`
(the ranks other than 0) dropped its notices: one only another rank's samples showed (an older
actor's unrecorded samples, read by rank 1 only) never reached the user. A quiet rank now holds
it, and rank 0 says it once after the step (`say_held`, an all-gather), naming the rank; a
notice every rank sees is still said once, by rank 0.

Each rank also checked only its own first record against later ones, so two actors recording
other credit settings whose samples reached only different ranks trained one model on mixed
credit. `say_held` now gathers the ranks' first records too, and every rank refuses alike."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pipeline_fakes import sample

from ludic.pipeline.credit_check import CreditCheck, CreditMismatchError, RankCredit, credit_record
from ludic.recipes.algorithms import GiGPOOptions
from ludic.rollouts.samples import SAWItem

HERE = Path(__file__).parent
UNRECORDED = "samples from actor 'old' do not record which --algorithm assigned their credit"


def _unrecorded() -> SAWItem:
    """A sample of an older actor, which records no credit."""
    return dataclasses.replace(sample(), meta={"actor_id": "old"})


def _gigpo(actor: str, gamma: float) -> SAWItem:
    """A sample of `actor`, which credits with --algorithm gigpo --gigpo.gamma `gamma`."""
    record = credit_record("gigpo", GiGPOOptions(gamma=gamma))
    return dataclasses.replace(sample(), meta={"actor_id": actor, "credit": record})


def _say_held_together(*checks: CreditCheck) -> list[Exception | None]:
    """Each rank's `say_held` at once, one thread per rank, with an all-gather that hands each
    every rank's share in rank order, as `all_gather_object` does between processes; returns
    what each rank raised (None: nothing)."""
    shares: list[RankCredit | None] = [None] * len(checks)
    raised: list[Exception | None] = [None] * len(checks)
    meet = threading.Barrier(len(checks), timeout=60)

    def rank(r: int) -> None:
        def all_gather(shared: RankCredit) -> list[RankCredit]:
            shares[r] = shared
            meet.wait()
            return [share for share in shares if share is not None]

        try:
            checks[r].say_held(all_gather)
        except Exception as e:
            raised[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(checks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return raised


def test_rank_0_says_what_only_another_rank_held_once(caplog: pytest.LogCaptureFixture) -> None:
    """Rank 0 (not quiet) holds no notice; it says the one only rank 1 held, naming rank 1."""
    rank_0, rank_1 = CreditCheck("grpo"), CreditCheck("grpo", quiet=True)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.credit_check"):
        rank_1(_unrecorded())  # only rank 1 reads the older actor's sample
        assert _say_held_together(rank_0, rank_1) == [None, None]
        rank_0(_unrecorded())  # now both do: said already
        rank_1(_unrecorded())
        assert _say_held_together(rank_0, rank_1) == [None, None]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"learner rank 1: {UNRECORDED}"), said


def test_a_lone_learner_says_at_once_and_holds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    check = CreditCheck("grpo")
    gathered: list[RankCredit] = []

    def gather(shared: RankCredit) -> list[RankCredit]:
        gathered.append(shared)
        return [shared]

    with caplog.at_level(logging.INFO, logger="ludic.pipeline.credit_check"):
        check(_unrecorded())
        assert len(caplog.records) == 1  # at once, not at the step's end
        check.say_held(gather)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(UNRECORDED), said
    assert gathered == [RankCredit(held={}, first=None)]


MIXED = (
    "actors on this stream assign credit differently: 'g1' (read by learner rank 1) with "
    "--algorithm gigpo --gigpo.gamma 0.95, 'g2' (read by learner rank 2) with --algorithm "
    "gigpo --gigpo.gamma 0.9: run every actor of a stream with the same --algorithm and "
    "--gigpo.* flags"
)
"""The refusal of actor g1 (--gigpo.gamma 0.95, read by rank 1) and g2 (0.9, rank 2)."""


def test_ranks_whose_first_records_differ_all_refuse_alike() -> None:
    """Each rank's own samples agree; across ranks they do not. A rank with no record yet
    (rank 0: an older actor's samples only) is compared with no one."""
    ranks = [CreditCheck("gigpo"), CreditCheck("gigpo", quiet=True)]
    ranks.append(CreditCheck("gigpo", quiet=True))
    ranks[0](_unrecorded())
    ranks[1](_gigpo("g1", 0.95))
    ranks[1](_gigpo("g1b", 0.95))  # another actor with the same flags, on one rank: fine
    assert _say_held_together(*ranks) == [None, None, None]  # no rank disagrees yet
    ranks[2](_gigpo("g2", 0.9))
    raised = _say_held_together(*ranks)
    assert all(isinstance(e, CreditMismatchError) for e in raised), raised
    assert [str(e) for e in raised] == [MIXED] * 3


def test_the_refusal_on_one_rank_has_the_same_words() -> None:
    """Two actors read by one rank: the refusal names no rank, in the same words."""
    check = CreditCheck("gigpo")
    check(_gigpo("g1", 0.95))
    with pytest.raises(CreditMismatchError) as refused:
        check(_gigpo("g2", 0.9))
    assert str(refused.value) == MIXED.replace(" (read by learner rank 1)", "").replace(
        " (read by learner rank 2)", ""
    )


def _torchrun_worker(scenario: str) -> list[str]:
    """The lines `credit_check_ranks_worker.py <scenario>` printed on 2 gloo ranks."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [*command, str(HERE / "credit_check_ranks_worker.py"), scenario],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,  # a rank stuck in a collective fails the test
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    lines = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert "rank 0: done" in lines and "rank 1: done" in lines, output
    return [line for line in lines if not line.endswith(": done")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.distributed
def test_two_gloo_ranks_say_each_notice_once() -> None:
    said = _torchrun_worker("notices")
    assert all(line.startswith("rank 0: ") for line in said), said  # rank 1 says nothing
    assert said[0] == "rank 0: INFO: samples from actor 'a': credit assigned with --algorithm grpo"
    assert said[1].startswith(f"rank 0: WARNING: learner rank 1: {UNRECORDED}"), said
    assert said[2].startswith("rank 0: WARNING: samples from actor 'c' do not record the --max")
    assert said[3].startswith("rank 0: INFO: samples from actor 'c': credit assigned with")
    assert len(said) == 4, said  # each notice once: none again at step 2, none from rank 1


@pytest.mark.distributed
def test_two_gloo_ranks_refuse_actors_each_read_by_one_rank() -> None:
    """Actor g0 (--gigpo.gamma 0.95) reaches only rank 0, g1 (0.9) only rank 1: both ranks
    refuse after the step, in the same words, naming both actors, their flags and ranks."""
    said = _torchrun_worker("records")
    refused = (
        "refused: actors on this stream assign credit differently: 'g0' (read by learner "
        "rank 0) with --algorithm gigpo --gigpo.gamma 0.95, 'g1' (read by learner rank 1) "
        "with --algorithm gigpo --gigpo.gamma 0.9: run every actor of a stream with the same "
        "--algorithm and --gigpo.* flags"
    )
    assert f"rank 0: {refused}" in said and f"rank 1: {refused}" in said, said
