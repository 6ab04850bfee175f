"""The GPU user paths, run the way the README tells users to (fresh processes, the CLI and the
Python API), where CUDA is present; CI has no GPU and skips them (`-m "not gpu"`).

- `ludic train --device cuda` at temperature 0.7 (a ratio loss on a non-default sampling
  transform): the trainer's recomputation equals the engine's behaviour logprobs to float noise
  on the first step, it learns, checkpoints, and `--resume` continues in a new process.
- `--dtype bfloat16` (autocast) learns within bfloat16 rounding of the behaviour logprobs;
  `--batch-invariant` gives a ratio of exactly 1 on the first step.
- The embedded engine on a bfloat16 model on the GPU: sampled tokens' logprobs agree with a
  plain forward of the same weights, and a published update changes what it serves.
- A checkpoint of parameters laid out in one storage takes no second model in GPU memory.
- `ludic serve --device cuda` with `ludic train --device cuda --server-url` on one GPU: NCCL
  cannot join two processes on one GPU, so the push goes over gloo, with a warning saying why.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CLI_TIMEOUT_S = 600


def ludic_cli(args: list[str], cwd: Path, timeout_s: float = CLI_TIMEOUT_S) -> str:
    """`ludic ARGS` in a fresh process; its output, or a failure showing it."""
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"ludic {' '.join(args)} exited {result.returncode}:\n{output}"
    return output


def metrics(out_dir: Path) -> list[dict[str, Any]]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def train_args(out_dir: Path, steps: int) -> list[str]:
    return [
        "train",
        "--device",
        "cuda",
        "--temperature",
        "0.7",
        "--steps",
        str(steps),
        "--problems-per-step",
        "2",
        "--group-size",
        "4",
        "--max-tokens",
        "8",
        "--out-dir",
        str(out_dir),
        "--no-progress",
    ]


def test_ludic_train_on_cuda_stays_on_policy_at_temperature_07_and_resumes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    ludic_cli(train_args(out, steps=2), cwd=tmp_path)
    first = metrics(out)
    assert [r["step"] for r in first] == [1, 2]
    # Same weights, same device, same sampling transform: the log ratio is float noise
    # (cuBLAS may pick other kernels for a batch of one than for the trainer's batch).
    assert first[0]["loss/mismatch/tokens"] == pytest.approx(1.0)
    assert first[0]["loss/mismatch/abs_log_ratio_mean"] < 1e-3, first[0]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in first)

    ludic_cli([*train_args(out, steps=3), "--resume", "latest"], cwd=tmp_path)
    resumed = metrics(out)
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert resumed[-1]["num_samples"] > 0
    assert resumed[-1]["loss/mismatch/abs_log_ratio_mean"] < 1e-3, resumed[-1]


def test_ludic_train_on_cuda_in_bfloat16_autocast_learns_within_bfloat16_rounding(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    ludic_cli([*train_args(out, steps=2), "--dtype", "bfloat16"], cwd=tmp_path)
    records = metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    # the engine samples in float32; the trainer's forward is bfloat16
    assert 1e-4 < records[0]["loss/mismatch/abs_log_ratio_mean"] < 0.1, records[0]


def test_ludic_train_on_cuda_batch_invariant_is_exactly_on_policy(tmp_path: Path) -> None:
    """`--batch-invariant`: engine and trainer share arithmetic, so the first step's ratio is
    exactly 1 on the GPU as on the CPU (same device, same dtype)."""
    out = tmp_path / "run"
    ludic_cli([*train_args(out, steps=1), "--batch-invariant"], cwd=tmp_path)
    first = metrics(out)[0]
    assert first["loss/mismatch/tokens"] == pytest.approx(1.0)
    assert first["loss/mismatch/abs_log_ratio_max"] == 0.0, first


def test_embedded_engine_serves_a_bfloat16_model_on_cuda_and_takes_a_push() -> None:
    from ludic.distributed import InProcessPublisher
    from ludic.inference import ChatRequest, SamplingConfig
    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.models import build_tiny_model

    model, tokenizer = build_tiny_model(seed=0)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    sampling = SamplingConfig(max_tokens=12, temperature=0.7, seed=3)
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], sampling=sampling)

    async def complete(engine: EmbeddedEngine) -> Any:
        return await engine.complete(request)

    with EmbeddedEngine(model, tokenizer) as engine:
        before = asyncio.run(complete(engine))
        ids = torch.tensor([before.prompt_token_ids + before.completion_token_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits.float() / sampling.temperature
        start = len(before.prompt_token_ids)
        expected = torch.log_softmax(logits[0, start - 1 : -1], dim=-1)
        completion = torch.tensor(before.completion_token_ids, device="cuda")
        recomputed = expected.gather(1, completion[:, None])[:, 0].cpu()
        served = torch.tensor(before.completion_logprobs)
        assert torch.isfinite(served).all()
        # bfloat16 on both sides, different kernels (the engine's KV-cached decode vs one
        # full forward): agreement to bfloat16 precision.
        assert (served - recomputed).abs().max() < 0.1, (served, recomputed)

        publisher = InProcessPublisher(engine)
        with torch.no_grad():
            state = {k: v.clone() for k, v in model.state_dict().items()}
            state["lm_head.weight"] = state["lm_head.weight"] * 2.0
        publisher.publish(state, version=1)
        after = asyncio.run(complete(engine))
        assert after.policy_version == 1
        assert after.completion_logprobs != before.completion_logprobs


def test_a_checkpoint_on_cuda_does_not_copy_the_model_in_gpu_memory(tmp_path: Path) -> None:
    """Parameters laid out in one storage (`contiguous_parameters`, on whenever a publisher is
    given): transformers clones tensors that share a storage before writing them, which was a
    second model in GPU memory at every checkpoint; they are copied to the host first."""
    from ludic.models import build_tiny_model
    from ludic.training import CheckpointConfig, Trainer, TrainerConfig, make_grpo

    model, tokenizer = build_tiny_model(seed=0)
    model = model.to("cuda")
    config = TrainerConfig(
        device="cuda",
        contiguous_parameters=True,
        checkpoint=CheckpointConfig(dir=str(tmp_path / "ckpt")),
    )
    trainer = Trainer(model, make_grpo(), object(), config, tokenizer=tokenizer)  # type: ignore[arg-type]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    path = trainer.save_checkpoint()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < weights // 4, (weights, before)
    assert (path / "model").is_dir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("server_device", "warning"),
    [("cuda:0", "on the trainer's GPU"), ("cpu", "serves on cpu")],
)
def test_ludic_serve_and_a_cuda_trainer_nccl_cannot_join_push_over_gloo_and_say_why(
    server_device: str, warning: str, tmp_path: Path
) -> None:
    """NCCL refuses two processes on one GPU and cannot reach a CPU server; the push goes over
    gloo instead, with a warning saying why."""
    import httpx

    from ludic.inference.vllm.server import wait_for_health
    from ludic.models import tiny_model_dir

    model_dir, port, token = str(tiny_model_dir()), free_port(), "gpu-token"
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "ludic.inference.http.server", "--model", model_dir]
    command += ["--port", str(port), "--token", token, "--device", server_device]
    with (tmp_path / "server.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_health(url, timeout_s=180, process=server)
        out = tmp_path / "run"
        args = [*train_args(out, steps=1), "--model", model_dir]
        args += ["--server-url", url, "--server-token", token]
        result = subprocess.run(
            [sys.executable, "-m", "ludic.cli", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        assert warning in output  # gloo, and the warning saying why
        assert metrics(out)[-1]["step"] == 1
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(url + "/ludic/version", headers=auth).json()["policy_version"] == 1
    finally:
        server.terminate()
        server.wait(timeout=30)
        print((tmp_path / "server.log").read_text()[-3000:])
