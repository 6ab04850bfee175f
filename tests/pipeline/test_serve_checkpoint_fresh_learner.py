"""A new run from a training checkpoint, as separate processes with a real redis-server:
`ludic serve --model RUN/checkpoints/step_N --policy-version 0` (the checkpoint's weights, at
the version a fresh learner starts from, not the saved one), actors that start generating
before any learner exists, then a fresh learner on `--model RUN/checkpoints/step_N`. The
learner trains the samples generated before it started as fresh (lag 0, none ahead of its
policy, none dropped: `--max-lag 3` over 3 steps drops nothing), publishes every step to the server and the server ends at its version."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from pipeline_fakes import SMALL_SPEC, RedisServer, redis_server, spawn, start_server, until

from ludic.models import load_model, tiny_model_dir
from ludic.training.checkpoint import CheckpointConfig, CheckpointManager

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(420)]
__all__ = ["redis_server"]
SPEC = SMALL_SPEC
TOKEN = "serve-checkpoint-token"
SAVED_VERSION = 5  # the checkpoint's own policy version: the new run must not inherit it


def _served_version(url: str) -> int:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    return int(httpx.get(url + "/ludic/version", headers=auth, timeout=30).json()["policy_version"])


def _serve(step_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    args = [
        "-m", "ludic.cli", "serve", "--model", str(step_dir), "--policy-version", "0",
        "--token", TOKEN, "--threads", "1",
    ]  # fmt: skip
    return start_server(args, log)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait(process: subprocess.Popen[bytes], log: Path) -> None:
    try:
        code = process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"process still running:\n{log.read_text()[-3000:]}") from None
    assert code == 0, f"exit code {code}:\n{log.read_text()[-3000:]}"


def _actor_batches(out: Path) -> list[dict[str, int]]:
    path = out / "actor.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_fresh_learner_behind_a_checkpoint_served_at_version_0(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    model, tokenizer = load_model(tiny_model_dir(spec=SPEC))
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path / "run" / "checkpoints")))
    step_dir = manager.save(step=6, model=model, policy_version=SAVED_VERSION, tokenizer=tokenizer)
    assert step_dir == tmp_path / "run" / "checkpoints" / "step_00000006"
    server, url = _serve(step_dir, tmp_path / "server.log")
    actor = learner = None
    try:
        assert _served_version(url) == 0  # --policy-version 0, not the checkpoint's 5
        actor_args = [
            "-m", "ludic.pipeline", "actor", "--redis-url", redis_server.url,
            "--server-url", url, "--env", "pipeline_fakes:CountOEnv", "--max-steps", "1",
            "--max-tokens", "8", "--problems-per-batch", "2", "--group-size", "2",
            "--batches", "4", "--actor-id", "a", "--max-backlog", "8",
            "--metrics-path", str(tmp_path / "actor.jsonl"),
        ]  # fmt: skip
        actor = spawn(actor_args, tmp_path / "actor.log")
        # no learner yet: the actor fills the backlog on the served checkpoint, at version 0
        until(lambda: len(_actor_batches(tmp_path)) >= 2, "the actor's first batches")
        early = _actor_batches(tmp_path)[:2]
        assert [(b["policy_version_min"], b["policy_version_max"]) for b in early] == [(0, 0)] * 2
        learner_log = tmp_path / "learner.log"
        learner_args = [
            "-m", "ludic.pipeline", "learner", "--redis-url", redis_server.url,
            "--server-url", url, "--token", TOKEN, "--model", str(step_dir),
            "--steps", "3", "--batch-size", "4", "--lr", "1e-2", "--max-lag", "3",
            "--checkpoint-every", "2", "--out-dir", str(tmp_path / "learner"),
        ]  # fmt: skip
        learner = spawn(learner_args, learner_log)
        _wait(learner, learner_log)
        _wait(actor, tmp_path / "actor.log")
        assert _served_version(url) == 3  # every step published and verified, from 0 on
    finally:
        for process in (learner, actor, server):
            if process is not None:
                _stop(process)
    steps = [json.loads(line) for line in (tmp_path / "learner" / "metrics.jsonl").open()]
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert [m["policy_version"] for m in steps] == [1.0, 2.0, 3.0]
    assert steps[0]["policy_lag/max"] == 0  # the samples made before it started are fresh
    assert all(m["policy_lag/ahead"] == 0 and m["num_samples"] == 4 for m in steps)
    assert all(m.get("batch/pipeline/dropped_stale", 0) == 0 for m in steps)
    log = learner_log.read_text()
    assert "learner done at step 3" in log and "newer than this learner's" not in log
    state = tmp_path / "learner" / "checkpoints" / "step_00000003" / "state.json"
    final = json.loads(state.read_text())
    assert final["policy_version"] == 3
