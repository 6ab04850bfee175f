"""`ludic train --server-url http://127.0.0.1:PORT/v1` (the OpenAI base URL a user copies from
a server's docs) against a `ludic serve` process: rollouts go through /v1, each step's weights
reach the server's root routes and are verified, and the server ends up serving exactly the
weights of the run's final checkpoint."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_fakes import TOKEN, Server

from ludic.inference import ChatRequest, ChatResponse, SamplingConfig

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]
PROMPT = [{"role": "user", "content": "1|2|3\n4|5|6\n7|8|9\nX to move"}]
GREEDY = SamplingConfig(temperature=0.0, max_tokens=6)
USER_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class SayO(SingleAgentEnv):
    """One turn rewarding the share of "o" in the reply: rewards vary, so weights move."""

    def env_reset(self, seed=None):
        return "Say something.", {}

    def env_step(self, action):
        return StepOutcome(obs="", reward=action.count("o") / max(1, len(action)), terminated=True)
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from ludic.models import tiny_model_dir

    started = Server(str(tiny_model_dir()), tmp_path_factory.mktemp("v1") / "server.log").start()
    try:
        started.wait()
        yield started
    finally:
        started.stop()


async def _served(url: str) -> ChatResponse:
    from ludic.recipes.inference import close_client, make_client

    client = make_client(url, api_key=TOKEN)
    try:
        return await client.complete(ChatRequest(messages=PROMPT, sampling=GREEDY))
    finally:
        await close_client(client)


async def _local(model_dir: Path | str) -> ChatResponse:
    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.recipes import load_policy

    model, tokenizer = load_policy(str(model_dir))
    with EmbeddedEngine(model, tokenizer) as engine:
        return await engine.complete(ChatRequest(messages=PROMPT, sampling=GREEDY))


def _logprob_gap(a: ChatResponse, b: ChatResponse) -> float:
    """Largest logprob difference when both sampled the same tokens, else infinity."""
    if a.completion_token_ids != b.completion_token_ids:
        return float("inf")
    pairs = zip(a.completion_logprobs or (), b.completion_logprobs or (), strict=True)
    return max(abs(x - y) for x, y in pairs)


def test_ludic_train_with_a_v1_server_url_pushes_verified_weights(
    server: Server, tmp_path: Path
) -> None:
    (tmp_path / "say_o.py").write_text(USER_ENV)
    v1 = server.url + "/v1"
    args = ["--env", "say_o:SayO", "--server-url", v1, "--server-token", TOKEN]
    args += ["--model", server.model_dir, "--steps", "2", "--problems-per-step", "2"]
    args += ["--group-size", "4", "--max-tokens", "8", "--max-steps", "1", "--lr", "1e-2"]
    args += ["--out-dir", str(tmp_path / "run"), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert server.served_version() == 2  # both pushes reached the server's root routes
    status = server.get("/ludic/weights/status")
    assert status["last_version"] == 2  # (then the run exited)
    # It said goodbye: no lost-trainer error, no c10d stack trace in the server's log.
    assert status["last_error"] is None and not status["connected"]
    assert "recvValueWithTimeout" not in server.log.read_text()
    checkpoint = next((tmp_path / "run" / "checkpoints").glob("step_*2/model"))
    served, trained, initial = (
        asyncio.run(_served(v1)),
        asyncio.run(_local(checkpoint)),
        asyncio.run(_local(server.model_dir)),
    )
    assert served.policy_version == 2
    assert _logprob_gap(served, trained) < 1e-4  # the server holds the final weights
    assert _logprob_gap(served, initial) > 1e-3  # and they are not the weights it started on


KILLED_TRAINER = """
import sys, time
from ludic.distributed import BroadcastPolicyPublisher
from ludic.recipes import load_policy

model, _ = load_policy(sys.argv[2])
publisher = BroadcastPolicyPublisher(sys.argv[1], sys.argv[3], probe_model=model, timeout_s=60)
publisher.publish(model, version=7)
print("published", flush=True)
time.sleep(300)
"""


def test_a_killed_trainer_is_reported_as_lost(server: Server, tmp_path: Path) -> None:
    """Unlike a normal end, a trainer that vanishes mid-run is reported in `last_error`."""
    import signal

    script = tmp_path / "trainer.py"
    script.write_text(KILLED_TRAINER)
    trainer = subprocess.Popen(
        [sys.executable, str(script), server.url, server.model_dir, TOKEN],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert trainer.stdout is not None and trainer.stdout.readline().strip() == "published"
        assert server.get("/ludic/weights/status")["control"] == "store"
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (error := server.get("/ludic/weights/status")["last_error"]) is None:
        assert time.monotonic() < deadline, "the killed trainer was never reported"
        time.sleep(0.2)
    assert "lost the trainer's store" in str(error)
    assert server.served_version() == 7
