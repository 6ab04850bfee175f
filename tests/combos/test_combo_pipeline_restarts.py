"""The Redis pipeline as README "Decoupled actor and learner over Redis" runs it, each side a
`ludic` command in its own process around a real redis-server and `ludic serve`: the learner
trains 3 steps with checkpoints and stops; the actor, ahead of it by its backlog, is stopped
with SIGTERM and restarted with the same flags; the learner is started again (resuming its
checkpoint) to step 6, and the actor stopped again. No sample is trained twice (the commit ledger), the restarted actor continues its batch
sequence instead of repeating it, the policy versions it samples at never go back, and the
learner's steps run 1..6 once each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from ludic.models import tiny_model_dir

HERE = Path(__file__).parent
TOKEN = "combo-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ludic(*args: str) -> list[str]:
    script = Path(sys.executable).parent / "ludic"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "ludic.cli"]
    return [*head, *args]


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`command` run in the log's folder (the test's), which its relative paths name."""
    path = os.pathsep.join([str(HERE), *sys.path])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    env["LUDIC_SERVER_TOKEN"] = TOKEN
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, env=env
        )


def _finish(process: subprocess.Popen[bytes], log: Path, code: int = 0) -> None:
    try:
        assert process.wait(timeout=900) == code, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ledger_ids(client: redis.Redis) -> list[str]:
    ids = [i for _, f in client.xrange("ludic:samples:ledger") for i in json.loads(f[b"ids"])]
    return [i for i in ids if i.split(":", 1)[0] not in ("duplicate", "invalid", "trimmed")]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(2400)  # a chain of launches; the shared CI box is slow
def test_actor_restarted_and_learner_resumed_train_each_sample_once(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not on PATH")
    port, serve_port = _free_port(), _free_port()
    (tmp_path / "redis").mkdir()
    store = _spawn(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1"),
            *("--dir", str(tmp_path / "redis"), "--appendonly", "yes"),
            *("--appendfsync", "always", "--save", ""),
        ],
        tmp_path / "redis.log",
    )
    model = str(tiny_model_dir(seed=0))
    server = _spawn(
        _ludic("serve", "--model", model, "--port", str(serve_port), "--threads", "1"),
        tmp_path / "serve.log",
    )
    urls = ["--redis-url", f"redis://127.0.0.1:{port}/0"]
    urls += ["--server-url", f"http://127.0.0.1:{serve_port}"]
    actor = [
        *_ludic("actor", *urls, "--env", "combo_say_o:SayOEnv", "--max-steps", "1"),
        *("--max-tokens", "8", "--problems-per-batch", "2", "--group-size", "2"),
        *("--actor-id", "a0", "--max-backlog", "8", "--metrics-path", "actor.jsonl"),
    ]
    learner = [
        *_ludic("learner", *urls, "--model", model, "--batch-size", "4", "--lr", "1e-2"),
        *("--checkpoint-every", "1", "--out-dir", "learner", "--ledger", "--max-lag", "None"),
    ]
    try:
        for launch in (1, 2):  # the actor runs ahead (its backlog) until it is stopped
            actor_log, learner_log = tmp_path / f"actor{launch}.log", tmp_path / f"l{launch}.log"
            running = _spawn([*actor, "--batches", "1000"], actor_log)
            _finish(_spawn([*learner, "--steps", str(3 * launch)], learner_log), learner_log)
            running.send_signal(signal.SIGTERM)
            _finish(running, actor_log, code=143)
        trained = _ledger_ids(redis.Redis(port=port))
    finally:
        for process in (server, store):
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)

    assert "resumed from step 3" in (tmp_path / "l2.log").read_text()
    steps = _records(tmp_path / "learner" / "metrics.jsonl")
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]
    assert len(trained) == 24 and not [i for i, n in Counter(trained).items() if n > 1]
    batches = _records(tmp_path / "actor.jsonl")
    indices = [b["batch_index"] for b in batches]
    assert indices == sorted(set(indices)), indices  # the restart went on, repeating none
    versions = [b["policy_version_max"] for b in batches]
    assert versions == sorted(versions) and versions[-1] >= 3, versions
