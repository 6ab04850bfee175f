"""Under torchrun every learner rank checks the samples it reads, and `CreditCheck(quiet=True)`
(the ranks other than 0) dropped its notices: one only another rank's samples showed (an older
actor's unrecorded samples, read by rank 1 only) never reached the user. A quiet rank now holds
it, and rank 0 says it once after the step (`say_held`, an all-gather), naming the rank; a
notice every rank sees is still said once, by rank 0."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_fakes import sample

from ludic.pipeline.credit_check import CreditCheck, Held
from ludic.rollouts.samples import SAWItem

HERE = Path(__file__).parent
UNRECORDED = "samples from actor 'old' do not record which --algorithm assigned their credit"


def _unrecorded() -> SAWItem:
    """A sample of an older actor, which records no credit."""
    return dataclasses.replace(sample(), meta={"actor_id": "old"})


def test_rank_0_says_what_only_another_rank_held_once(caplog: pytest.LogCaptureFixture) -> None:
    """In one process: each rank's `say_held` gets both ranks' held notices, in rank order, as
    `all_gather_object` hands them between processes (rank 0, not quiet, holds none)."""
    rank_0, rank_1 = CreditCheck("grpo"), CreditCheck("grpo", quiet=True)

    def step() -> None:
        from_1: list[Held] = []

        def gather_1(held: Held) -> list[Held]:
            from_1.append(held)
            return [{}, held]

        rank_1.say_held(gather_1)
        rank_0.say_held(lambda held: [held, from_1[0]])

    with caplog.at_level(logging.INFO, logger="ludic.pipeline.credit_check"):
        rank_1(_unrecorded())  # only rank 1 reads the older actor's sample
        step()
        rank_0(_unrecorded())  # now both do: said already
        rank_1(_unrecorded())
        step()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"learner rank 1: {UNRECORDED}"), said


def test_a_lone_learner_says_at_once_and_holds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    check = CreditCheck("grpo")
    gathered: list[Held] = []

    def gather(held: Held) -> list[Held]:
        gathered.append(held)
        return [held]

    with caplog.at_level(logging.INFO, logger="ludic.pipeline.credit_check"):
        check(_unrecorded())
        assert len(caplog.records) == 1  # at once, not at the step's end
        check.say_held(gather)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(UNRECORDED), said
    assert gathered == [{}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.distributed
def test_two_gloo_ranks_say_each_notice_once() -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    command += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [*command, str(HERE / "credit_check_ranks_worker.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,  # a rank stuck in a collective fails the test
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    lines = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert "rank 0: done" in lines and "rank 1: done" in lines, output
    said = [line for line in lines if not line.endswith(": done")]
    assert all(line.startswith("rank 0: ") for line in said), said  # rank 1 says nothing
    assert said[0] == "rank 0: INFO: samples from actor 'a': credit assigned with --algorithm grpo"
    assert said[1].startswith(f"rank 0: WARNING: learner rank 1: {UNRECORDED}"), said
    assert said[2].startswith("rank 0: WARNING: samples from actor 'c' do not record the --max")
    assert said[3].startswith("rank 0: INFO: samples from actor 'c': credit assigned with")
    assert len(said) == 4, said  # each notice once: none again at step 2, none from rank 1
