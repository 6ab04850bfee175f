"""FSDP2 on 2 gloo ranks (torchrun) publishing to a `ludic serve` subprocess with verification
on, as `ludic learner` does: nothing hangs, and the server ends up serving the trainer's
version and exactly the trainer's weights (full fine-tuning, then LoRA merged). When the
server is stopped mid-run, the next push fails on rank 0 and both ranks stop with errors
naming the cause (rank 1's naming rank 0), instead of rank 1 waiting in a collective."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from dist_worker_common import torchrun, torchrun_exit

from ludic.distributed.checksum import checksums
from ludic.distributed.verification import default_probe_tokens, reference_logprobs
from ludic.models import TinyModelSpec, load_model, tiny_model_dir

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
TOKEN = "fsdp-publish-token"
SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tokenizer_vocab_size=300,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(log_dir: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """`ludic serve --model DIR --token T` on a free port; yields its URL, DIR and process."""
    model_dir = tiny_model_dir(spec=SPEC)
    port = _free_port()
    ludic = Path(sys.executable).with_name("ludic")
    command = [str(ludic)] if ludic.exists() else [sys.executable, "-m", "ludic.cli"]
    command += ["serve", "--model", str(model_dir), "--token", TOKEN, "--port", str(port)]
    log = log_dir / "serve.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ludic serve did not start:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url, model_dir, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`ludic serve` for the module's tests; yields its URL and model directory."""
    with _serve(tmp_path_factory.mktemp("serve")) as (url, model_dir, _):
        yield url, model_dir


@pytest.fixture(scope="module")
def results(served: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url, model_dir = served
    out = tmp_path_factory.mktemp("fsdp-publish")
    torchrun("dist_worker_publish.py", str(out), url, TOKEN, str(model_dir), timeout_s=240)
    loaded: dict[str, Any] = torch.load(out / "results.pt", weights_only=False)
    return loaded


def _served_logprobs(url: str, ids: list[int]) -> list[float]:
    reply = httpx.post(
        url + "/ludic/logprobs",
        json={"token_ids": ids},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    return [float(x) for x in reply.json()["logprobs"]]


def test_verified_fsdp_publishes_do_not_hang_and_land_exactly(results: dict[str, Any]) -> None:
    for phase, version in (("full", 2), ("lora", 4)):
        got = results[phase]
        assert got["version"] == version
        assert [h["policy_version"] for h in got["history"]] == [version - 1, version]
        assert got["verify_seconds"] > 0  # verification ran: version, checksums and the probe
        # What the server reported holding after the last push is exactly what was trained.
        expected = {name: list(c) for name, c in checksums(got["weights"]).items()}
        assert got["held_checksums"] == expected, phase


def test_the_server_serves_the_trainers_last_version_and_weights(
    served: tuple[str, Path], results: dict[str, Any]
) -> None:
    url, model_dir = served
    reply = httpx.get(url + "/ludic/version", headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.json()["policy_version"] == 4
    merged = results["lora"]["weights"]
    model, _ = load_model(model_dir, dtype=torch.float32)
    untrained = reference_logprobs(model, ids := default_probe_tokens(300, length=24, seed=7))
    model.load_state_dict(merged)
    expected = reference_logprobs(model, ids)
    served_lp = _served_logprobs(url, ids)
    assert torch.allclose(torch.tensor(served_lp), torch.tensor(expected), atol=1e-5)
    assert not torch.allclose(torch.tensor(served_lp), torch.tensor(untrained), atol=1e-3)


def test_a_server_stopped_mid_run_stops_every_rank_naming_the_cause(tmp_path: Path) -> None:
    with _serve(tmp_path) as (url, model_dir, server):
        code, output = torchrun_exit(
            "dist_worker_publish_server_down.py",
            str(tmp_path),
            url,
            TOKEN,
            str(model_dir),
            str(server.pid),
            timeout_s=240,
        )
        assert server.poll() is not None  # rank 0 stopped it after version 1
    assert code != 0, output[-4000:]
    raised = {}
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing (killed, not stopped):\n{output[-4000:]}"
        raised[rank] = json.loads(path.read_text())
        assert raised[rank]["raised"] is not None, output[-4000:]
    assert raised[0]["published"] == 1
    own, other = raised[0]["raised"], raised[1]["raised"]
    assert own["step"] == other["step"] == 2
    # rank 0: the publisher's own error, still catchable as such (WeightPushError)
    assert "WeightPushError" in own["classes"], own
    assert other["type"] == "RankFailedError", other
    assert "rank 0 failed while publishing policy version 2" in other["message"]
    assert f"{own['type']}: {own['message']}" in other["message"]
