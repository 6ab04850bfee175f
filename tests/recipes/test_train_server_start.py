"""`ludic train --server-url` pushes its starting weights (`--model`) as policy version 0 before
the first rollout, so step 1 is on-policy whatever the server held: weights an earlier run
pushed, or another model of the same shape. A server of another architecture refuses that push
before any episode, naming `--model`. Fresh `ludic serve` and `ludic train` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_fakes import TOKEN, Server

pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.timeout(300)]
ON_POLICY = 1e-3  # |log ratio| of a sample against the trainer's recomputation: float noise
USER_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class SayO(SingleAgentEnv):
    """One turn rewarding the share of "o" in the reply: rewards vary, so weights move."""

    def env_reset(self, seed=None):
        return "Say something.", {}

    def env_step(self, action):
        return StepOutcome(obs="", reward=action.count("o") / max(1, len(action)), terminated=True)
'''


def _serve(model_dir: Path, log: Path) -> Iterator[Server]:
    started = Server(str(model_dir), log).start()
    try:
        started.wait()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def same_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `ludic serve` of the starting model for the tests that train against it (one
    process start-up, not one a test): what an earlier test pushed there is what a user's
    server holds from an earlier run, which each `ludic train` replaces first."""
    from ludic.models import tiny_model_dir

    yield from _serve(tiny_model_dir(), tmp_path_factory.mktemp("server") / "server.log")


def _train(server: Server, cwd: Path, out: str, model: Path | str, steps: int, *extra: str) -> Any:
    (cwd / "say_o.py").write_text(USER_ENV)
    args = ["--env", "say_o:SayO", "--server-url", server.url, "--server-token", TOKEN]
    args += ["--model", str(model), "--steps", str(steps), "--problems-per-step", "2"]
    args += ["--group-size", "4", "--max-tokens", "8", "--max-steps", "1", "--lr", "1e-2"]
    args += ["--out-dir", str(cwd / out), "--no-progress", *extra]
    return subprocess.run(
        [sys.executable, "-m", "ludic.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=cwd,
        check=False,
    )


def _steps(out_dir: Path) -> list[dict[str, float]]:
    return [dict(json.loads(line)) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def _first_step(out_dir: Path) -> dict[str, float]:
    return _steps(out_dir)[0]


def _assert_on_policy(step: dict[str, float]) -> None:
    lags = {k: v for k, v in step.items() if k.startswith("policy_lag/")}
    assert step.get("policy_lag/0", 0) > 0 and step.get("policy_lag/max") == 0, lags
    assert not step.get("policy_lag/ahead") and not step.get("policy_lag/3+"), lags
    gap = step["loss/mismatch/abs_log_ratio_max"]
    assert gap < ON_POLICY, gap
    assert (
        abs(step["loss/ratio_min"] - 1) < ON_POLICY and abs(step["loss/ratio_max"] - 1) < ON_POLICY
    )


def test_a_server_an_earlier_run_pushed_to_is_reset_to_the_starting_weights(
    same_model_server: Server, tmp_path: Path
) -> None:
    from ludic.models import tiny_model_dir

    earlier = _train(same_model_server, tmp_path, "earlier", tiny_model_dir(), steps=3)
    assert earlier.returncode == 0, (earlier.stdout + earlier.stderr)[-3000:]
    assert same_model_server.served_version() == 3  # the server now holds trained weights
    again = _train(same_model_server, tmp_path, "again", tiny_model_dir(), steps=2)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    _assert_on_policy(_first_step(tmp_path / "again"))
    assert "pushed as policy version 0" in again.stdout
    assert same_model_server.served_version() == 2


def test_a_server_of_another_model_of_the_same_shape_serves_the_trainers(tmp_path: Path) -> None:
    from ludic.models import tiny_model_dir

    for server in _serve(tiny_model_dir(seed=1), tmp_path / "server.log"):
        result = _train(server, tmp_path, "run", tiny_model_dir(seed=0), steps=1)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        _assert_on_policy(_first_step(tmp_path / "run"))
        assert server.served_version() == 1


def test_a_server_of_another_architecture_is_refused_before_any_episode(tmp_path: Path) -> None:
    from ludic.models import TinyModelSpec, tiny_model_dir

    narrow = tiny_model_dir(spec=TinyModelSpec(hidden_size=128, intermediate_size=352))
    for server in _serve(narrow, tmp_path / "server.log"):
        result = _train(server, tmp_path, "run", tiny_model_dir(), steps=2)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output[-3000:]
        assert "ludic train: error: --server-url refused this run's starting weights" in output
        assert "shape mismatches" in output and "ludic train --model DIR" in output, output
        assert "Traceback" not in output, output[-3000:]  # a refusal, not a crash
        rollouts = tmp_path / "run" / "rollouts.jsonl"
        assert not rollouts.exists() or not rollouts.read_text().strip()  # no episode was played
        metrics = tmp_path / "run" / "metrics.jsonl"
        assert not metrics.exists() or not metrics.read_text().strip()  # nor any step
        assert server.served_version() == 0  # the server kept its own weights


def test_a_ratio_loss_at_temperature_07_stays_on_policy_across_a_resume(
    same_model_server: Server, tmp_path: Path
) -> None:
    """The neighbours a real run combines: a user's env through the CLI, a served policy,
    sampling at temperature 0.7 with a ratio loss, then `--resume` against the same server."""
    from ludic.models import tiny_model_dir

    flags = ("--temperature", "0.7", "--algorithm", "gspo")
    first = _train(same_model_server, tmp_path, "run", tiny_model_dir(), 2, *flags)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    resumed = _train(same_model_server, tmp_path, "run", tiny_model_dir(), 3, *flags, "--resume")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "pushed as policy version 0" not in resumed.stdout  # the checkpoint's weights instead
    steps = _steps(tmp_path / "run")
    assert [int(step["step"]) for step in steps] == [1, 2, 3]
    for step in steps:
        _assert_on_policy(step)
    assert same_model_server.served_version() == 3
