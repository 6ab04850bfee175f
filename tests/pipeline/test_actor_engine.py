"""`ludic actor` without --server-url: the embedded engine takes --batch-invariant and
--prepacked-gemm (refused where they cannot apply, with the words `ludic train` and `ludic eval`
use, before Redis or a model is touched); run as the README shows, the actor names the engine
settings it holds, logs each batch and says why it waits when no learner reads the stream. The
learner names each step (the Trainer warns when steps change no weight: tests/training/test_no_signal.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pipeline_fakes import SMALL_SPEC, RedisServer, log_learner_step, redis_server

from ludic.models import tiny_model_dir
from ludic.pipeline import commands
from ludic.pipeline.commands import _actor_client, _embedded_engine, run_actor
from ludic.pipeline.config import ActorConfig

__all__ = ["redis_server"]
HERE = Path(__file__).parent
SPEC = SMALL_SPEC
CONFLICTS = [
    (dict(prepacked_gemm=True, batch_invariant=True), r"--prepacked-gemm and --batch-invariant"),
    (
        dict(prepacked_gemm=True, server_url=("http://127.0.0.1:1",)),
        r"--prepacked-gemm applies to the embedded engine, not to --server-url.*ludic serve "
        r"--prepacked-gemm",
    ),
    (
        dict(batch_invariant=True, server_url=("http://127.0.0.1:1",)),
        r"--batch-invariant applies to the embedded engine, not to --server-url.*ludic serve "
        r"--batch-invariant",
    ),
]


@pytest.mark.parametrize(("flags", "words"), CONFLICTS)
def test_conflicting_engine_flags_are_refused_before_any_work(
    monkeypatch: pytest.MonkeyPatch, flags: dict[str, Any], words: str
) -> None:
    def no_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the actor started work before checking its flags")

    monkeypatch.setattr(commands, "_act", no_work)
    cfg = ActorConfig(redis_url="redis://127.0.0.1:1/0", batches=1, **flags)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=words):
        run_actor(cfg)


@pytest.mark.parametrize("flag", ["batch_invariant", "prepacked_gemm", None])
def test_the_embedded_engine_holds_the_flag(
    flag: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = ActorConfig(model=str(tiny_model_dir(spec=SPEC)), **({flag: True} if flag else {}))  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.commands"):
        engine = _embedded_engine(cfg)
    try:
        assert engine.config.batch_invariant is (flag == "batch_invariant")
        assert engine.config.prepacked_gemm is (flag == "prepacked_gemm")
    finally:
        engine.close()
    named = f"(--{flag.replace('_', '-')})" if flag else "(default kernels)"
    assert f"engine: embedded on {cfg.model} {named}" in caplog.text


def ludic_actor(redis: RedisServer, log: Path, *flags: str) -> subprocess.Popen[bytes]:
    """`ludic actor ...` as a user types it (the console script), this folder importable."""
    ludic = Path(sys.executable).parent / "ludic"
    head = [str(ludic)] if ludic.exists() else [sys.executable, "-m", "ludic.cli"]
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    args = [
        *head, "actor", "--redis-url", redis.url, "--env", "pipeline_fakes:CountOEnv",
        "--max-steps", "1", "--max-tokens", "8", "--problems-per-batch", "2", "--group-size",
        "2", "--actor-id", "a", "--model", str(tiny_model_dir(spec=SPEC)), *flags,
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)


def _until_logged(process: subprocess.Popen[bytes], log: Path, text: str) -> str:
    deadline = time.monotonic() + 120
    while text not in log.read_text():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)
    return log.read_text()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--prepacked-gemm", "--batch-invariant"])
def test_ludic_actor_runs_the_flag_and_says_why_it_waits(
    redis_server: RedisServer, tmp_path: Path, flag: str
) -> None:
    """One batch of 4 samples fills --max-backlog 2, so with no learner the actor must say
    that it waits, and for what, instead of hanging in silence; SIGTERM then ends it."""
    log = tmp_path / "actor.log"
    actor = ludic_actor(redis_server, log, flag, "--max-backlog", "2", "--batches", "2")
    try:
        text = _until_logged(actor, log, "waits for the learner")
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=60) == 143, log.read_text()
    finally:
        if actor.poll() is None:
            actor.kill()
    assert f"engine: embedded on {tiny_model_dir(spec=SPEC)} ({flag})" in text
    assert (
        "ludic.pipeline.commands: actor 'a' batch 0: 4 samples from 4 episodes (0 failed)" in text
    )
    assert (
        "stream 'ludic:samples' holds 4 undelivered samples, max_backlog (--max-backlog) is 2; "
        "the last batch held 4 samples, more than --max-backlog alone, so the next starts "
        "once a learner of group 'ludic-learners' has read them all"
    ) in text
    assert redis_server.client().xlen("ludic:samples") == 4


def _metrics(**overrides: float) -> dict[str, float]:
    base = {"num_samples": 8.0, "reward_mean": -1.0, "loss": 0.0, "grad_norm": 0.0}
    return {**base, "parse_error_rate": 1.0, "policy_version": 3.0, **overrides}


@pytest.mark.parametrize(
    "metrics",
    [
        _metrics(grad_norm=0.5, loss=0.1),
        _metrics(skipped_empty=1.0, num_samples=0.0),
        _metrics(),  # no weight changed: the Trainer warns (tests/training/test_no_signal.py)
    ],
)
def test_a_learner_step_that_trained_gives_one_line(
    metrics: dict[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.learner_report"):
        log_learner_step(metrics)
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_actor_and_learner_lines_say_which_mean_reward_they_give(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The actor's mean is per episode, the learner's per sample (turn): on the same data they
    read -10.000 and -1.000 (ten failed turns of -1), both called "mean reward"."""
    from ludic.pipeline.actor import ActorBatchStats

    stats = ActorBatchStats(
        batch_index=0, num_rollouts=32, num_failed=0, num_samples=320, mean_reward=-10.0,
        policy_version_min=0, policy_version_max=0, backpressure_seconds=0.0,
        generate_seconds=1.0,
    )  # fmt: skip
    assert "mean episode reward -10.000" in commands.batch_line(ActorConfig(), stats)
    with caplog.at_level(logging.INFO, logger="ludic.pipeline.learner_report"):
        log_learner_step(_metrics())
    assert "mean reward per sample -1.000" in caplog.text


def test_a_server_that_is_down_is_named_with_the_fix() -> None:
    """`ludic actor --server-url` at a port nobody serves: one ValueError naming the URL, the
    command that starts a server and --served-model (it was a bare httpx.ConnectError)."""
    cfg = ActorConfig(redis_url="redis://127.0.0.1:1/0", server_url=("http://127.0.0.1:1",))
    with pytest.raises(ValueError, match=r"http://127.0.0.1:1/v1/models.*ConnectError") as e:
        asyncio.run(_actor_client(cfg))
    assert "ludic serve --model DIR" in str(e.value) and "--served-model" in str(e.value)
