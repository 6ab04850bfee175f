"""2 gloo ranks (torchrun, FSDP2) -> resumed on 1 process -> `ludic eval`, each a new process:
the README's multi-process program (`combo_fsdp_sft.py`: SFT on expert games, a checkpoint
every step) trained 2 steps on 2 ranks writes whole checkpoints (rank 0, HF format, tokenizer
included); the same program in one process resumes the 2-rank checkpoint, saying every rank
takes rank 0's position, and continues the step count and metrics.jsonl; `ludic eval --model`
loads the final checkpoint (its manifest verified) and plays it at its policy version."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cwd: Path, command: list[str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    return " ".join((done.stdout + done.stderr).split())


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sft(cwd: Path, steps: int, ranks: int) -> str:
    script = [str(HERE / "combo_fsdp_sft.py"), "data/expert.jsonl", "out", str(steps)]
    if ranks == 1:
        return _run(cwd, [sys.executable, *script])
    launch = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}"]
    launch += ["--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    return _run(cwd, [sys.executable, *launch, *script])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_two_rank_checkpoint_resumed_on_one_process_then_evaluated(tmp_path: Path) -> None:
    expert = [str(REPO / "examples" / "rejection_sampling.py"), "--expert", "--problems", "8"]
    _run(tmp_path, [sys.executable, *expert, "--out", "data/expert.jsonl"])

    said = _sft(tmp_path, 2, ranks=2)
    assert "world size 2; resumed at step 0; out/checkpoints/step_00000002" in said, said
    model = tmp_path / "out" / "checkpoints" / "step_00000002" / "model"
    assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()
    assert [m["step"] for m in _records(tmp_path / "out" / "metrics.jsonl")] == [1, 2]

    said = _sft(tmp_path, 3, ranks=1)
    assert "step_00000002 was written by 2 ranks, resuming on 1" in said, said
    assert "world size 1; resumed at step 2; out/checkpoints/step_00000003" in said, said
    assert [m["step"] for m in _records(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3]

    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    _run(
        tmp_path,
        [
            *(*head, "eval", "--env", "tictactoe", "--model", "out/checkpoints/step_00000003"),
            *("--num-problems", "2", "--samples-per-problem", "2", "--max-steps", "3"),
            *("--max-tokens", "8", "--out-dir", "eval", "--no-progress"),
        ],
    )
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["episodes"] == 4
    rollouts = _records(tmp_path / "eval" / "rollouts.jsonl")
    versions = {s["policy_version"] for r in rollouts for s in r["steps"] if s["kind"] == "agent"}
    assert versions == {3}
