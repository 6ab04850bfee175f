"""The pipeline commands' configs: light to import, parsed from the command line by tyro."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tyro

from ludic.pipeline import ActorConfig, LearnerConfig
from ludic.pipeline.commands import make_algorithm


def test_importing_the_configs_is_light() -> None:
    check = (
        "import sys, ludic.pipeline; from ludic.pipeline import ActorConfig, LearnerConfig; "
        "heavy = sorted(m for m in ('torch', 'redis', 'transformers') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_command_lines_parse() -> None:
    learner = tyro.cli(
        LearnerConfig,
        args=["--redis-url", "redis://h:1/0", "--max-lag", "None", "--stale", "downweight"],
    )
    assert learner.redis_url == "redis://h:1/0" and learner.max_lag is None
    assert learner.stale == "downweight" and learner.consumer == "learner"
    assert learner.checkpoint_every == 50  # exactly once with checkpoints by default
    actor = tyro.cli(ActorConfig, args=["--server-url", "http://s:8000", "--batches", "3"])
    assert actor.server_url == ("http://s:8000",) and actor.batches == 3
    assert actor.max_backlog == 256
    many = ["--server-url", "http://a:1", "http://b:2", "http://c:3"]
    assert tyro.cli(ActorConfig, args=many).server_url == ("http://a:1", "http://b:2", "http://c:3")
    assert tyro.cli(LearnerConfig, args=many).server_url == (
        "http://a:1",
        "http://b:2",
        "http://c:3",
    )


def test_algorithm_presets_by_name() -> None:
    assert make_algorithm("grpo").name == "grpo"
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        make_algorithm("ppo")  # type: ignore[arg-type]
