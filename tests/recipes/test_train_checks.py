"""`ludic train` refuses, before the model loads, flags that can never train (a count below 1,
`--group-size 1` with a group-baseline preset) and a `--resume` whose env, algorithm, group size
or sampling differ from the checkpoint's run (recorded in its state.json); a checkpoint saved
before that record existed resumes with a one-line notice."""

from __future__ import annotations

import hashlib
import io
import json
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
from ludic.recipes.train_checks import RUN_SETTINGS_KEY, check_group_size, group_baseline

ENV = """
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Once(SingleAgentEnv):
    def env_reset(self, seed=None):
        return "Say o.", {}

    def env_step(self, action):
        return StepOutcome(obs="done", reward=float("o" in action), terminated=True)


class Twice(Once):
    def __init__(self, x=0):
        super().__init__()
"""

SMALL = ["--problems-per-step", "1", "--group-size", "2", "--max-tokens", "2", "--max-steps", "1"]
SMALL += ["--checkpoint-every", "1", "--no-progress"]


def ludic_train(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`ludic train` in a new process, run in `cwd` (which holds the env module)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        cwd=cwd,
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def config(*args: str) -> TrainConfig:
    return tyro.cli(TrainConfig, args=list(args))


@pytest.mark.parametrize(
    ("flag", "value"), [("--steps", "0"), ("--problems-per-step", "0"), ("--group-size", "0")]
)
def test_a_count_below_one_is_refused_naming_the_flag(
    tmp_path: Path, flag: str, value: str
) -> None:
    out = tmp_path / "run"
    cfg = config("--env", "tictactoe", "--out-dir", str(out), flag, value)
    with pytest.raises(
        ValueError, match=rf"^{flag} is {value}, so nothing would train: pass {flag} >= 1"
    ):
        train_command(cfg, console=Console(file=io.StringIO()))
    assert not out.exists()  # refused before the lock, the model or a checkpoint


def test_group_size_one_is_refused_for_exactly_the_group_baseline_presets() -> None:
    needs_groups = {name for name in PRESETS if group_baseline(make_algorithm(name, max_tokens=8))}
    assert needs_groups == set(PRESETS) - {"reinforce", "reinforce_pp"}
    for name in PRESETS:
        cfg = config("--algorithm", name, "--group-size", "1")
        algorithm = make_algorithm(name, max_tokens=8)
        if name in needs_groups:
            with pytest.raises(ValueError, match=rf"--group-size 1 with --algorithm {name}:"):
                check_group_size(cfg, algorithm)
        else:
            check_group_size(cfg, algorithm)  # no group baseline: one episode per group trains
        check_group_size(config("--algorithm", name, "--group-size", "2"), algorithm)


@pytest.mark.slow
def test_cli_refuses_group_size_one_with_grpo_before_training(tmp_path: Path) -> None:
    (tmp_path / "checks_env.py").write_text(ENV)
    args = ["--env", "checks_env:Once", "--steps", "3", "--out-dir", "run", *SMALL]
    done = ludic_train(tmp_path, *args, "--group-size", "1")
    assert done.returncode == 1
    assert "--group-size 1 with --algorithm grpo:" in done.stderr  # a traceback or one block
    assert "Pass --group-size 2 or more" in done.stderr and "--algorithm reinforce" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def strip_run_settings(step_dir: Path) -> None:
    """Make `step_dir` look saved by an older ludic: no run settings in state.json (its
    manifest entry rewritten to match, as such a save had it)."""
    state_path = step_dir / "state.json"
    state = json.loads(state_path.read_text())
    del state["extra"][RUN_SETTINGS_KEY]
    state_path.write_text(json.dumps(state))
    manifest_path = step_dir / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    data = state_path.read_bytes()
    manifest["files"]["state.json"] = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.slow
def test_resume_with_another_env_or_algorithm_is_refused_naming_each_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "checks_env.py").write_text(ENV)
    first = ["--env", "checks_env:Once", "--algorithm", "gigpo", "--out-dir", "run", *SMALL]
    assert ludic_train(tmp_path, *first, "--steps", "1").returncode == 0
    run = tmp_path / "run"
    saved = json.loads((run / "checkpoints" / "step_00000001" / "state.json").read_text())
    assert saved["extra"][RUN_SETTINGS_KEY]["--algorithm"] == "gigpo"
    metrics = (run / "metrics.jsonl").read_text()

    other = ["--env", "checks_env:Twice", "--algorithm", "rloo", "--out-dir", "run", *SMALL]
    done = ludic_train(tmp_path, *other, "--env-kwargs", '{"x": 1}', "--steps", "3", "--resume")
    assert done.returncode == 1, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if "with other settings" in line]
    assert "--env is checks_env:Twice, the checkpoint's checks_env:Once" in error
    assert "--algorithm is rloo, the checkpoint's gigpo" in error
    assert """--env-kwargs is '{"x": 1}', the checkpoint's '{}'""" in error
    assert "--temperature" not in error  # unchanged flags are not named
    keep = "(--env checks_env:Once --env-kwargs '{}' --algorithm gigpo) to continue it"
    assert f"Pass the checkpoint's flags {keep}" in error
    assert "or another --out-dir" in error
    assert "loading" not in done.stdout.lower() and (run / "metrics.jsonl").read_text() == metrics

    # the same flags resume (in process here); a checkpoint without the record, with a notice
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = io.StringIO()
    train_command(config(*first, "--steps", "2", "--resume"), console=Console(file=out))
    assert "does not record" not in out.getvalue()
    strip_run_settings(run / "checkpoints" / "step_00000002")
    out = io.StringIO()
    resumed = train_command(config(*other, "--steps", "3", "--resume"), console=Console(file=out))
    assert resumed.steps == 1
    text = " ".join(out.getvalue().split())
    assert "step_00000002 does not record its run's --env/--algorithm" in text
    assert "resuming without checking" in text
