"""Shared helpers for the pipeline tests: a real redis-server on a free loopback port (with an
append-only file, so it can be restarted without losing data), and sample builders."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import redis

from ludic.envs.single_agent import SingleAgentEnv
from ludic.models import TinyModelSpec
from ludic.pipeline.learner_report import report_step
from ludic.pipeline.source import PipelineBatchSource
from ludic.rollouts.samples import SAWItem
from ludic.types import Info, StepOutcome

SMALL_SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    tokenizer_vocab_size=300,
)
"""The one-layer model the pipeline's process tests serve and train (seconds to build)."""

REDIS_BINARY = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A redis-server we started (and stop by its pid)."""

    port: int
    dir: Path
    process: subprocess.Popen[bytes] | None = field(default=None)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_BINARY is not None
        cmd = [REDIS_BINARY, "--port", str(self.port), "--bind", "127.0.0.1"]
        cmd += ["--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "always"]
        cmd += ["--save", "", "--protected-mode", "no", "--daemonize", "no"]
        log = (self.dir / "redis.log").open("ab")
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start:\n{(self.dir / 'redis.log').read_text()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()  # SIGTERM: redis flushes the append-only file and exits
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if REDIS_BINARY is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    data = tmp_path / "redis"
    data.mkdir()
    server = RedisServer(port=free_port(), dir=data)
    server.start()
    yield server
    server.stop()


def sample(
    n: int = 6, *, weight: float = 1.0, versions: tuple[int, ...] = (), logprobs: bool = True
) -> SAWItem:
    """A small sample: `n` tokens, the last half are actions."""
    mask = tuple(0 if i < n // 2 else 1 for i in range(n))
    return SAWItem(
        input_ids=tuple(range(10, 10 + n)),
        action_mask=mask,
        weight=weight,
        behavior_logprobs=tuple(-0.5 * m for m in mask) if logprobs else None,
        meta={"policy_versions": list(versions), "reward": 1.0, "rollout_id": "r"},
    )


class CountOEnv(SingleAgentEnv):
    """One turn; reward = number of "o" in the reply (varied even for a random model)."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=float(action.count("o")), terminated=True)


def spawn(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """`python <args>` with one torch thread and this folder importable (`pipeline_fakes:...`)."""
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )


def until(condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds. (Its own
    copy of app_server.until: `ludic actor` processes import this module as an env from
    tests/pipeline alone, where app_server is not importable.)"""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def start_server(args: Sequence[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`python <args> --port <a free port>` (`ludic serve` or `ludic.inference.http.server`)
    once it answers /health, and its URL; it exiting first fails the test with its log."""
    port = free_port()
    process = spawn([*args, "--port", str(port)], log)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    until(healthy, f"the server ({' '.join(args[:3])}) to answer /health")
    return process, url


# A `ludic` command in a fresh interpreter where importing torch or transformers fails loudly.
NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} imported before the Redis check")
        return None

sys.meta_path.insert(0, NoTorch())
from ludic.cli import main
main(sys.argv[1:], report_refusals=True)
"""


def ludic_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    """`ludic <args>` where importing torch or transformers raises (`NO_TORCH`)."""
    return subprocess.run(
        [sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, timeout=100
    )


def log_learner_step(metrics: dict[str, float], *, step: int = 1) -> str | None:
    """The learner's own step report (`report_step`) for a single rank at `step`."""
    trainer = SimpleNamespace(step=step, runtime=SimpleNamespace(world_size=1))
    source = SimpleNamespace(rank=0, timed_out=False, timed_out_dropped=0)
    return report_step(trainer, source, metrics)


def expire_leases(*sources: PipelineBatchSource) -> None:
    """In-process stand-in for a killed learner: its consumer leases stop being renewed and
    are gone (as one ttl after SIGKILL), while its read entries stay pending."""
    for source in sources:
        lease, source._lease = source._lease, None
        if lease is not None:
            lease.release()
