"""A run trained on a GPU continues on a CPU, as a user who trains on a GPU box and evaluates
or continues on a laptop does, each stage a new process: `ludic sft --device cuda` ->
`ludic train --device cuda --model` the SFT checkpoint -> `ludic train --device cpu --resume`
(weights, optimizer state and RNG saved from CUDA) -> `ludic eval` and `ludic view` of the
result on the CPU. CI has no GPU and skips it (`-m "not gpu"`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

GPU = os.environ.get("LUDIC_TEST_GPU_DEVICE", "cuda")
"""The training device; `LUDIC_TEST_GPU_DEVICE=cpu` runs the same path without a GPU (how it
was checked on a CPU box before it ran on one)."""

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # five fresh processes; 12 minutes on a loaded 2-core box
    pytest.mark.skipif(
        GPU.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA GPU"
    ),
]

REPO = Path(__file__).resolve().parents[2]
RL_FLAGS = (
    *("--env", "tictactoe", "--problems-per-step", "2", "--group-size", "2"),
    *("--max-steps", "3", "--max-tokens", "8", "--lr", "1e-3", "--temperature", "0.7"),
    *("--checkpoint-every", "1", "--no-progress", "--out-dir", "run"),
)


def run(args: list[str], cwd: Path) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return " ".join(output.split())  # rich wraps long lines


def ludic(*args: str) -> list[str]:
    return [sys.executable, "-m", "ludic.cli", *args]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_and_rl_on_the_gpu_then_resumed_evaluated_and_viewed_on_the_cpu(
    tmp_path: Path,
) -> None:
    example = str(REPO / "examples" / "rejection_sampling.py")
    run([sys.executable, example, "--expert", "--problems", "8", "--out", "expert.jsonl"], tmp_path)
    run(
        ludic(
            *("sft", "--data", "expert.jsonl", "--steps", "2", "--batch-size", "8"),
            *("--device", GPU, "--out-dir", "sft", "--no-progress"),
        ),
        tmp_path,
    )
    model = "sft/checkpoints/step_00000002/model"
    assert (tmp_path / model / "config.json").is_file()

    run(ludic("train", *RL_FLAGS, "--model", model, "--device", GPU, "--steps", "2"), tmp_path)
    on_gpu = records(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in on_gpu] == [1, 2]

    resumed = run(
        ludic("train", *RL_FLAGS, "--model", model, "--device", "cpu", "--steps", "3", "--resume"),
        tmp_path,
    )
    assert "resumed at step 2" in resumed, resumed
    metrics = records(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    last = metrics[-1]
    assert last["num_samples"] > 0 and torch.isfinite(torch.tensor(last["loss"]))
    # the CPU engine samples from the weights the GPU trained: on-policy to float noise
    assert last["loss/mismatch/abs_log_ratio_mean"] < 1e-3, last

    checkpoint = "run/checkpoints/step_00000003"
    run(
        ludic(
            *("eval", "--env", "tictactoe", "--model", checkpoint, "--num-problems", "2"),
            *("--samples-per-problem", "2", "--max-steps", "3", "--max-tokens", "8"),
            *("--temperature", "0.7", "--out-dir", "eval", "--no-progress"),
        ),
        tmp_path,
    )
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["episodes"] == 4
    run(
        ludic(
            *("view", "run/rollouts.jsonl", "--samples", "run/samples.jsonl"),
            *("--tokenizer", checkpoint, "--out", "view.html"),
        ),
        tmp_path,
    )
    html = (tmp_path / "view.html").read_text()
    assert all(r["id"] in html for r in records(tmp_path / "run" / "rollouts.jsonl"))
