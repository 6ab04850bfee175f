"""`ludic actor` and `ludic learner` refuse, before Redis, a server or a model is touched, counts
below 1 (as `ludic train` does), a negative `--max-lag`, and a dr_grpo learner without
`--max-tokens`; each refusal names the flag and the fix, printed as one error block."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pipeline_fakes import SMALL_SPEC, RedisServer, ludic_without_torch, redis_server

from ludic.cli import main as ludic_main
from ludic.models import tiny_model_dir
from ludic.pipeline.commands import run_actor, run_learner
from ludic.pipeline.config import ActorConfig, LearnerConfig
from ludic.pipeline.flag_checks import check_learner_counts

__all__ = ["redis_server"]
NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: a check that ran late would fail there
pytestmark = pytest.mark.timeout(60)

ACTOR_COUNTS = [
    ("problems_per_batch", "--problems-per-batch", 0),
    ("group_size", "--group-size", 0),
    ("group_size", "--group-size", -3),
    ("max_steps", "--max-steps", 0),
    ("concurrency", "--concurrency", 0),
    ("batches", "--batches", 0),
    ("max_backlog", "--max-backlog", 0),
    ("max_stream_len", "--max-stream-len", -1),
]
LEARNER_COUNTS = [
    ("steps", "--steps", 0),
    ("steps", "--steps", -1),
    ("batch_size", "--batch-size", 0),
    ("publish_every", "--publish-every", 0),
    ("server_ranks", "--server-ranks", 0),
    ("max_tokens", "--max-tokens", 0),
]


def _count_refusal(flag: str, value: int) -> str:
    return rf"^{flag} is {value}, so nothing would train: pass {flag} >= 1 \("


@pytest.mark.parametrize(("field", "flag", "value"), ACTOR_COUNTS)
def test_actor_refuses_a_count_below_one(field: str, flag: str, value: int) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=_count_refusal(flag, value)):
        run_actor(ActorConfig(redis_url=NO_REDIS, **kwargs))


@pytest.mark.parametrize(("field", "flag", "value"), LEARNER_COUNTS)
def test_learner_refuses_a_count_below_one(field: str, flag: str, value: int) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=_count_refusal(flag, value)):
        run_learner(LearnerConfig(redis_url=NO_REDIS, **kwargs))


def test_learner_refuses_a_negative_max_lag() -> None:
    with pytest.raises(ValueError, match=r"^--max-lag is -1: pass --max-lag >= 0 .* None"):
        run_learner(LearnerConfig(redis_url=NO_REDIS, max_lag=-1))


def test_learner_refuses_a_lease_ttl_of_zero_and_a_missing_model_before_redis() -> None:
    for ttl in (0, float("nan")):
        with pytest.raises(ValueError, match=rf"^--lease-ttl-s is {ttl}: pass seconds > 0"):
            run_learner(LearnerConfig(redis_url=NO_REDIS, lease_ttl_s=ttl))
    with pytest.raises(FileNotFoundError, match=r"^no model directory at /nonexist"):
        run_learner(LearnerConfig(redis_url=NO_REDIS, model="/nonexist"))


def test_dr_grpo_learner_needs_the_actors_max_tokens() -> None:
    with pytest.raises(ValueError, match=r"^--algorithm dr_grpo divides its loss by the actors'"):
        run_learner(LearnerConfig(redis_url=NO_REDIS, algorithm="dr_grpo"))


def test_an_unused_max_tokens_is_named(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.flag_checks"):
        check_learner_counts(LearnerConfig(algorithm="grpo", max_tokens=64))
        check_learner_counts(LearnerConfig(algorithm="dr_grpo", max_tokens=64))
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith("--max-tokens 64 is unused: only dr_grpo's loss divides")


@pytest.mark.parametrize(
    ("command", "args", "line"),
    [
        ("actor", ["--group-size", "0"], "--group-size is 0, so nothing would train"),
        ("actor", ["--problems-per-batch", "0"], "--problems-per-batch is 0, so nothing"),
        ("learner", ["--steps", "0"], "--steps is 0, so nothing would train"),
        ("learner", ["--batch-size", "-2"], "--batch-size is -2, so nothing would train"),
    ],
)
def test_the_cli_prints_one_error_block(
    command: str, args: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        ludic_main([command, "--redis-url", NO_REDIS, *args], report_refusals=True)
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"ludic {command}: error: {line}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["actor", "learner"])
def test_a_count_below_one_is_refused_without_torch(command: str, tmp_path: Path) -> None:
    """The refusal, in `ludic train`'s words, needs no torch (which takes 10-40 s to import on a
    loaded box): the actor and the learner call the same torch-free `check_count_flags`."""
    flag = "--group-size" if command == "actor" else "--steps"
    out = ["--out-dir", str(tmp_path / "run")] if command == "learner" else []
    result = ludic_without_torch(command, flag, "0", "--redis-url", NO_REDIS, *out)
    assert result.returncode == 1, result.stderr
    assert f"ludic {command}: error: {flag} is 0, so nothing would train: pass {flag} >= 1" in (
        result.stderr
    )
    assert "imported before the Redis check" not in result.stderr


@pytest.mark.parametrize("value", [0.0, -5.0, float("nan")])
def test_an_episode_timeout_not_above_zero_is_refused_before_redis(value: float) -> None:
    with pytest.raises(ValueError, match=r"--episode-timeout-s must be > 0 seconds"):
        run_actor(ActorConfig(redis_url=NO_REDIS, env="tictactoe", episode_timeout_s=value))


@pytest.mark.redis
def test_the_actors_engine_bounds_each_episode(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ludic actor had no episode timeout: an env whose step never returned stalled it silently
    import ludic.rollouts

    built: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def engine(**kwargs: Any) -> None:
        built.update(kwargs)
        raise Stop

    assert ActorConfig().episode_timeout_s == 600.0
    monkeypatch.setattr(ludic.rollouts, "RolloutEngine", engine)
    cfg = ActorConfig(
        redis_url=redis_server.url,
        env="tictactoe",
        model=str(tiny_model_dir(spec=SMALL_SPEC)),
        episode_timeout_s=12.5,
    )
    with pytest.raises(Stop):
        run_actor(cfg)
    assert built["episode_timeout_s"] == 12.5
