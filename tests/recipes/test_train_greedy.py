"""`ludic train --temperature 0` is refused before the model loads with a preset that cannot
learn from greedy rollouts: a group baseline (every episode of a group is the same completion,
so every advantage is 0) or a ratio loss (it assumes sampled completions). The refusal names the
flag and the fix; REINFORCE (neither) still trains greedily."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tyro
from rich.console import Console

from ludic.recipes.algorithms import PRESETS, make_algorithm
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import train_command
from ludic.recipes.train_checks import check_greedy, group_baseline, ratio_loss
from ludic.training.algorithm import make_reinforce, make_rloo, with_rollout_correction
from ludic.training.losses import TruncatedIS

ENV = """
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Once(SingleAgentEnv):
    def env_reset(self, seed=None):
        return "Say o.", {}

    def env_step(self, action):
        return StepOutcome(obs="done", reward=float("o" in action), terminated=True)
"""


def config(*args: str) -> TrainConfig:
    return tyro.cli(TrainConfig, args=list(args))


def test_the_ratio_loss_presets_are_the_clipped_and_weighted_ones() -> None:
    ratios = {name for name in PRESETS if ratio_loss(make_algorithm(name, max_tokens=8))}
    assert ratios == {
        "grpo",
        "dr_grpo",
        "gspo",
        "cispo",
        "gmpo",
        "gigpo",
        "reinforce_pp",
        "reinforce_pp_baseline",
    }
    assert ratio_loss(make_reinforce(truncated_is_cap=2.0))  # a truncated importance weight
    assert ratio_loss(with_rollout_correction(make_rloo(), TruncatedIS(cap=2.0)))
    assert not ratio_loss(make_rloo())


def test_temperature_zero_is_refused_for_every_preset_but_reinforce() -> None:
    for name in PRESETS:
        algorithm = make_algorithm(name, max_tokens=8)
        cfg = config("--algorithm", name, "--temperature", "0")
        if name == "reinforce":
            check_greedy(cfg, algorithm)  # no group, no ratio: greedy REINFORCE trains
        else:
            with pytest.raises(ValueError, match=rf"^--temperature 0 with --algorithm {name}: "):
                check_greedy(cfg, algorithm)
        check_greedy(config("--algorithm", name, "--temperature", "0.7"), algorithm)


@pytest.mark.parametrize(
    ("name", "says", "not_says"),
    [
        ("rloo", "every advantage is 0", "importance ratio"),  # group baseline only
        ("reinforce_pp", "importance ratio", "every advantage is 0"),  # ratio loss only
        ("grpo", "every advantage is 0: nothing trains; and its loss", None),  # both
    ],
)
def test_the_refusal_gives_each_reason_that_applies_and_the_fix(
    name: str, says: str, not_says: str | None
) -> None:
    algorithm = make_algorithm(name, max_tokens=8)
    assert group_baseline(algorithm) == ("every advantage is 0" in says or name == "grpo")
    with pytest.raises(ValueError) as refused:
        check_greedy(config("--algorithm", name, "--temperature", "0"), algorithm)
    message = str(refused.value)
    assert says in message and (not_says is None or not_says not in message), message
    assert "Pass --temperature above 0 (e.g. 1.0, the default, or 0.7)" in message


def test_train_command_refuses_before_the_run_directory_or_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = config("--env", "tictactoe", "--out-dir", str(out), "--temperature", "0")
    with pytest.raises(ValueError, match=r"^--temperature 0 with --algorithm grpo: "):
        train_command(cfg, console=Console(file=io.StringIO()))
    assert not out.exists()


@pytest.mark.slow
def test_ludic_train_temperature_zero_is_one_error_block_and_reinforce_trains(
    tmp_path: Path,
) -> None:
    (tmp_path / "greedy_env.py").write_text(ENV)
    args = ["--env", "greedy_env:Once", "--steps", "1", "--problems-per-step", "1"]
    args += ["--group-size", "2", "--max-tokens", "2", "--max-steps", "1", "--no-progress"]
    args += ["--temperature", "0"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def ludic_train(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ludic.cli", "train", *args, *more],
            cwd=tmp_path,
            env={**env, "COLUMNS": "400", "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    refused = ludic_train("--out-dir", "refused")
    assert refused.returncode == 1
    assert "ludic train: error: --temperature 0 with --algorithm grpo:" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "refused").exists()
    trained = ludic_train("--out-dir", "reinforce", "--algorithm", "reinforce")
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "reinforce" / "metrics.jsonl").read_text().strip()
