"""`ludic actor` refuses, before any work (no Redis, no server, no model), the flags with which
its `--algorithm` cannot learn, with `ludic train`'s messages: `--group-size 1` with a group
baseline, `--temperature 0` with a group baseline or a ratio loss. (`ludic learner` takes no
group size or temperature: the samples it reads were made by the actors.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ludic.pipeline.commands import check_actor_preset, run_actor
from ludic.pipeline.config import ActorConfig
from ludic.recipes.algorithms import GiGPOOptions

NO_REDIS = "redis://127.0.0.1:1/0"  # nothing listens: a check that ran late would fail there


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "gigpo", "reinforce_pp_baseline", "awr"])
def test_group_size_one_with_a_group_baseline_is_refused(algorithm: str) -> None:
    cfg = ActorConfig(redis_url=NO_REDIS, algorithm=algorithm, group_size=1, batches=1)
    with pytest.raises(ValueError, match=rf"^--group-size 1 with --algorithm {algorithm}: "):
        run_actor(cfg)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp"])
def test_temperature_zero_with_a_group_baseline_or_ratio_loss_is_refused(algorithm: str) -> None:
    cfg = ActorConfig(redis_url=NO_REDIS, algorithm=algorithm, temperature=0.0, batches=1)
    with pytest.raises(ValueError, match=rf"^--temperature 0 with --algorithm {algorithm}: "):
        run_actor(cfg)


def test_reinforce_passes_both_checks() -> None:
    """REINFORCE has neither a group baseline nor a ratio loss: greedy groups of one train."""
    check_actor_preset(ActorConfig(algorithm="reinforce", group_size=1, temperature=0.0))
    check_actor_preset(ActorConfig(algorithm="grpo", group_size=2, temperature=0.7))


def test_the_cli_prints_one_error_block() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "actor", "--redis-url", NO_REDIS, "--group-size", "1"],
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "ludic actor: error: --group-size 1 with --algorithm grpo:" in done.stderr
    assert "Traceback" not in done.stderr


def test_gigpo_flags_with_another_preset_are_refused_before_redis() -> None:
    cfg = ActorConfig(
        redis_url=NO_REDIS, algorithm="grpo", gigpo=GiGPOOptions(omega=0.3), batches=1
    )
    with pytest.raises(ValueError, match=r"^--gigpo\.\* options apply only to --algorithm gigpo"):
        run_actor(cfg)


def test_a_gigpo_state_key_that_takes_no_turn_is_refused_before_redis() -> None:
    cfg = ActorConfig(
        redis_url=NO_REDIS,
        algorithm="gigpo",
        gigpo=GiGPOOptions(state_key="os:getcwd"),
        batches=1,
    )
    with pytest.raises(ValueError, match=r"^--gigpo\.state-key os:getcwd: getcwd\(\) cannot be"):
        run_actor(cfg)
