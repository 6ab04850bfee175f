"""`ludic train` is single-process: launched by torchrun with 2 ranks it is refused on every
rank (each rank checks; the unit test below checks rank 1's refusal), up front, saying what to
use for multi-process training (not "another ludic run", which is what rank 0 used to hear when
its own rank 1 took the run lock)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.recipes.run_lock import (
    MultiProcessLaunchError,
    check_run_lock,
    check_single_process,
    run_lock,
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_torchrun_ludic_train_is_refused_on_every_rank(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "ludic"
    ludic = [str(script)] if script.exists() else ["-m", "ludic.cli"]
    out_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        *ludic,
        *("train", "--env", "tictactoe", "--steps", "1", "--out-dir", str(out_dir)),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    # Every rank refuses, but torchrun stops the other rank as soon as one exits with an error,
    # so the other's line may never be printed: one refusal is what the output can promise.
    refusals = [
        rank
        for rank in (0, 1)
        if f"`ludic train` runs in one process, but this is rank {rank} of WORLD_SIZE=2" in out
    ]
    assert refusals, out
    assert "another ludic run" not in out, out
    assert "ludic.pipeline learner" in out and "Multi-process training (FSDP2)" in out, out
    assert not (out_dir / "run.lock").exists()  # refused before touching the directory


def test_the_run_lock_refuses_a_multi_process_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "run.lock"
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1: one process, fine
    check_single_process()
    with run_lock(lock, what="ludic"):
        assert lock.exists()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(MultiProcessLaunchError, match="rank 1 of WORLD_SIZE=2"):
        check_run_lock(lock, what="ludic")  # ludic sft and quickstart ask this first
    refused = pytest.raises(MultiProcessLaunchError, match="this ludic command runs in one process")
    with refused, run_lock(lock, what="ludic"):
        pass
    assert not lock.exists()
