"""Shared by the 2-process FSDP/LoRA tests and the scripts torchrun launches for them: the data
each rank trains on, the trainer config, and a torchrun launcher whose hang fails the test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from training_fakes import WeightedNLL, mixed_items, tiny_llama

from ludic.rollouts.samples import SAWItem
from ludic.training import (
    CheckpointConfig,
    ConstantCredit,
    LossInputs,
    LossOutput,
    RLAlgorithm,
    Trainer,
    TrainerConfig,
    add_lora,
)

HERE = Path(__file__).parent
ALGORITHM = RLAlgorithm(name="test", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())

# STEP_BATCHES[step][rank]: unequal sizes, then an empty rank (rank 1 has nothing to train on),
# then unequal micro-batch counts, then one step after the checkpoint at step 3.
STEP_BATCHES: list[list[list[SAWItem]]] = [
    [mixed_items(3, seed=1), mixed_items(2, seed=2)],
    [mixed_items(4, seed=3), []],
    [mixed_items(1, seed=4), mixed_items(5, seed=5)],
    [mixed_items(2, seed=6), mixed_items(3, seed=7)],
]


SENTINEL = 777.0
"""A sample weight that makes `SentinelNLL` return nan."""


@dataclass(frozen=True, kw_only=True)
class SentinelNLL(WeightedNLL):
    """`WeightedNLL`, but nan when a sample in the micro-batch has weight `SENTINEL` (a
    non-finite loss on one rank only)."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        out = WeightedNLL.__call__(self, inputs)
        if bool((inputs.advantages_B == SENTINEL).any()):
            return LossOutput(loss=out.loss * float("nan"), metrics=out.metrics)
        return out


def batches_for(rank: int, world_size: int) -> list[list[SAWItem]]:
    """What `rank` trains on; one process gets every rank's samples at each step."""
    if world_size == 1:
        return [[item for share in step for item in share] for step in STEP_BATCHES]
    assert world_size == 2, world_size
    return [step[rank] for step in STEP_BATCHES]


def trainer_config(
    checkpoint_dir: Path, *, every_n_steps: int = 3, device: str = "cpu"
) -> TrainerConfig:
    return TrainerConfig(
        device=device,
        lr=5e-3,
        weight_decay=0.1,
        max_grad_norm=0.5,
        micro_batch_tokens=32,
        seed=11,
        checkpoint=CheckpointConfig(
            dir=str(checkpoint_dir), every_n_steps=every_n_steps, keep_last=None
        ),
    )


def lora_model(seed: int = 0) -> torch.nn.Module:
    """The tiny Llama with LoRA on q/v, adapters initialised from `seed` (B non-zero, so the
    adapters change the outputs from the first step)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = add_lora(tiny_llama(seed=0), rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
        for name, param in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
    return model


def record_outcome(
    out_dir: Path, rank: int, trainer: Trainer, run: Callable[[dict[str, Any]], None]
) -> None:
    """A worker's run as a user's script has it (`try/finally: trainer.close()`): `run(result)`,
    then OUT_DIR/rank{R}.json holds `result` with what it raised under "raised" (type, its
    classes, message, the trainer's step; None when nothing), written before the Trainer's
    closing barrier. The error is re-raised, so the rank exits non-zero."""
    result: dict[str, Any] = {"raised": None}
    try:
        run(result)
    except Exception as e:
        result["raised"] = {
            "type": type(e).__name__,
            "classes": [c.__name__ for c in type(e).__mro__],
            "message": str(e),
            "step": trainer.step,
        }
        raise
    finally:
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
        trainer.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc), children before their parents' kin."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def torchrun(script: str, *args: str, timeout_s: float = 300.0) -> str:
    """Run tests/training/`script` on 2 gloo ranks on 127.0.0.1; fails the test on a non-zero
    exit or when it runs past `timeout_s` (a hung collective), killing the process group."""
    returncode, output = torchrun_exit(script, *args, timeout_s=timeout_s)
    if returncode != 0:
        pytest.fail(f"torchrun {script} exited with {returncode}:\n{output[-8000:]}")
    return output


def torchrun_exit(script: str, *args: str, timeout_s: float = 300.0) -> tuple[int, str]:
    """`torchrun`, for a script expected to fail: its exit status and output; fails the test
    only when it runs past `timeout_s` (a hung collective)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(HERE / script),
        *args,
    ]
    # PYTHONFAULTHANDLER: a rank killed by a C++ abort (SIGABRT, seen once in CI as "terminate
    # called without an active exception") prints the Python stack it was in
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONFAULTHANDLER": "1",
    }
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # torchrun starts its workers in sessions of their own: kill them by descent, or they
        # keep the output pipe open and the test blocks instead of failing
        for pid in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"torchrun {script} hung for over {timeout_s}s:\n{output[-6000:]}")
    return proc.returncode, output
