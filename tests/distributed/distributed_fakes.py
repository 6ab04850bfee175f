"""Shared helpers for the weight-sync tests: a small model spec, a two-rank gloo group in one
process (two threads), and an embedded server with the weight-sync routes in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import torch

from ludic.distributed.manifest import WeightManifest
from ludic.distributed.transfer import (
    BufferPool,
    Collective,
    host_store,
    join_store,
    open_group,
    send_buckets,
)
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.http.weight_join import InitRequest
from ludic.inference.http.weight_receiver import WeightSyncReceiver
from ludic.inference.http.weight_tenure import TrainerInfo
from ludic.models import TinyModelSpec

SPEC = TinyModelSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
    tokenizer_vocab_size=300,
)
TOKEN = "sync-token"
SERVER_MAIN = Path(__file__).with_name("weight_server_main.py")
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nudge_(model: torch.nn.Module, delta: float) -> None:
    """Move every parameter by `delta` (the trainer has taken a step)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(delta)


def run_ranks(fns: Sequence[Callable[[Collective], T]], timeout_s: float = 30.0) -> list[T]:
    """Run `fns[r]` as rank r of a fresh gloo group (one thread per rank); rank 0 hosts."""
    world_size = len(fns)
    store = host_store("127.0.0.1", 0, world_size=world_size, timeout_s=timeout_s)
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            s = store
            if rank:
                s = join_store("127.0.0.1", store.port, world_size=world_size, timeout_s=timeout_s)
            group = open_group(
                s, rank=rank, world_size=world_size, backend="gloo", timeout_s=timeout_s
            )
            results[rank] = fns[rank](group)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 10)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return [results[r] for r in range(world_size)]


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_weight_server(model_dir: Path, log: Path) -> ServerProcess:
    """`weight_server_main.py` (embedded server + weight-sync routes) on a free port."""
    port = free_port()
    cmd = [sys.executable, str(SERVER_MAIN), str(model_dir), str(port), TOKEN]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(url=f"http://127.0.0.1:{port}", process=process, log=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server did not become healthy:\n{log.read_text()[-3000:]}")


class BufferedEngine(EmbeddedEngine):
    """EmbeddedEngine without `update_weights_in_place`: the weight receiver then stages each
    push in its own buffers and loads it with `update_weights` (what an engine without in-place
    receiving gets)."""

    update_weights_in_place = None  # type: ignore[assignment]


RECEIVER_TIMEOUT_S = 30.0


class ReceiverTrainer:
    """Rank 0 of a weight-sync group that `receiver` (a `WeightSyncReceiver`) joins, as the
    trainer with id `who`: `id` is the group id the receiver answered."""

    def __init__(self, receiver: WeightSyncReceiver, who: str) -> None:
        self.store = host_store("127.0.0.1", 0, world_size=2, timeout_s=RECEIVER_TIMEOUT_S)
        joined: list[Collective] = []
        opening = threading.Thread(target=lambda: joined.append(self._open()), daemon=True)
        opening.start()
        req = InitRequest(
            host="127.0.0.1",
            port=self.store.port,
            timeout_s=RECEIVER_TIMEOUT_S,
            trainer=TrainerInfo(id=who),
        )
        self.id = receiver.init(req)
        opening.join(RECEIVER_TIMEOUT_S)
        self.group = joined[0]

    def _open(self) -> Collective:
        return open_group(
            self.store, rank=0, world_size=2, backend="gloo", timeout_s=RECEIVER_TIMEOUT_S
        )

    def send(self, manifest: WeightManifest, state: dict[str, torch.Tensor]) -> None:
        send_buckets(self.group, manifest, state, pool=BufferPool("cpu"))
