"""LoRA + checkpoint + resume + `ludic serve` of the checkpoint, each a new process: a LoRA run
on a base model given by a relative path saves adapter checkpoints; `ludic serve --model` that
checkpoint, started from another directory, serves the merged policy; the run resumed in a new
process with `--server-url` that server pushes the restored weights before its first rollout
(the resumed step's episodes carry the checkpoint's policy version) and then each step's, and the
server ends serving exactly the final checkpoint's merged weights."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from ludic.models import load_model, tiny_model_dir

pytest.importorskip("peft")

HERE = Path(__file__).parent
TOKEN = "combo-token"
PROMPT_IDS = [5, 17, 42, 99, 3, 250, 7]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lora_run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(HERE / "combo_lora_run.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _serve(checkpoint: Path, cwd: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    args = ["serve", "--model", str(checkpoint), "--token", TOKEN, "--port", str(port)]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*head, *args, "--threads", "1"], cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        assert server.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "ludic serve did not answer /health in 300 s"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def _served(url: str) -> tuple[list[int], list[float]]:
    """A sampled completion of PROMPT_IDS (temperature 1, seeded) and its logprobs."""
    body = {
        "model": "ludic",
        "prompt": PROMPT_IDS,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 0,
        "logprobs": 1,
        "return_token_ids": True,
    }
    choice = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def _logprobs_of(checkpoint: Path, completion: list[int]) -> torch.Tensor:
    """The checkpoint's merged model's logprobs of `completion` after PROMPT_IDS."""
    model, _ = load_model(str(checkpoint))
    ids = torch.tensor([PROMPT_IDS + completion])
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits[0, len(PROMPT_IDS) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, len(PROMPT_IDS) :, None])[
        :, 0
    ]


def _policy_versions(rollouts: Path) -> dict[int, set[int]]:
    """Per batch index, the policy versions its episodes' model calls were served at."""
    versions: dict[int, set[int]] = {}
    for line in rollouts.read_text().splitlines():
        record = json.loads(line)
        batch = versions.setdefault(record["meta"]["batch_index"], set())
        batch.update(step["policy_version"] for step in record["steps"] if step["kind"] == "agent")
    return versions


@pytest.mark.slow
def test_lora_checkpoint_served_then_resumed_against_that_server(tmp_path: Path) -> None:
    shutil.copytree(tiny_model_dir(seed=0, cache_dir=tmp_path / "models"), tmp_path / "base")
    assert "resumed at step 0" in _lora_run(tmp_path, "base", "run", "2")
    step2 = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert (step2 / "model" / "adapter_config.json").is_file()
    assert not (step2 / "model" / "model.safetensors").exists()  # adapters only

    elsewhere = tmp_path / "elsewhere"  # the relative base must not matter from here
    elsewhere.mkdir()
    server, url = _serve(step2, elsewhere, tmp_path / "serve.log")
    try:
        tokens2, logprobs2 = _served(url)
        served2 = torch.tensor(logprobs2)
        torch.testing.assert_close(served2, _logprobs_of(step2, tokens2), atol=1e-4, rtol=0)

        resumed = _lora_run(tmp_path, "base", "run", "4", url, TOKEN)
        assert "resumed at step 2" in resumed
        version = httpx.get(url + "/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
        assert version.json()["policy_version"] == 4
        step4 = tmp_path / "run" / "checkpoints" / "step_00000004"
        tokens4, logprobs4 = _served(url)
        served4 = torch.tensor(logprobs4)
        torch.testing.assert_close(served4, _logprobs_of(step4, tokens4), atol=1e-4, rtol=0)
        assert not torch.allclose(_logprobs_of(step4, tokens2), served2, atol=1e-4, rtol=0)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    # Batches 0-1 on the embedded engine; after the resume the first batch (index 2) was drawn
    # from the restored weights pushed as version 2, the next from version 3.
    assert _policy_versions(tmp_path / "run" / "rollouts.jsonl") == {
        0: {0},
        1: {1},
        2: {2},
        3: {3},
    }
