"""`ludic eval --credit gigpo`: GiGPO's credit over the evaluated groups, with the same
`--gigpo.*` knobs as `ludic train`, reported in metrics.json and per turn in credit.jsonl."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from ludic.cli import main as ludic_main
from ludic.eval.command import EvalConfig, run_eval_command
from ludic.eval.credit_report import _metrics
from ludic.recipes.algorithms import GiGPOOptions
from ludic.rollouts.rollout_log import read_rollouts_jsonl
from ludic.training.credit import GiGPO

STEP_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Steps(SingleAgentEnv):
    """Three turns, reward 1 for a reply with an "o"; the turn count is the state key."""

    def env_reset(self, seed=None):
        self.turn = 0
        return "Start.", {}

    def env_step(self, action):
        self.turn += 1
        return StepOutcome(obs="Again.", reward=float("o" in action), terminated=self.turn >= 3)

    def env_state_key(self):
        return self.turn


def make_env():
    return Steps()
'''


def _observation_anchor(turn: Any) -> Any:
    return hashlib.sha256(turn.observation.encode()).hexdigest() if turn.agent_steps else None


def test_metrics_of_hand_made_rows() -> None:
    rows = [
        {"anchor_group_size": 2, "episode_advantage": 1.0, "step_advantage": -0.5},
        {"anchor_group_size": 2, "episode_advantage": -1.0, "step_advantage": 0.5},
        {"anchor_group_size": 1, "episode_advantage": 1.0, "step_advantage": 0.0},
        {"anchor_group_size": 0, "episode_advantage": -1.0, "step_advantage": 0.0},
    ]
    assert _metrics(rows) == {
        "gigpo/turns": 4.0,
        "gigpo/anchored_turn_fraction": 0.5,
        "gigpo/mean_anchor_group_size": 2.0,
        "gigpo/mean_abs_episode_advantage": 1.0,
        "gigpo/mean_abs_step_advantage": 0.25,
    }


@pytest.mark.slow
def test_ludic_eval_reports_gigpo_credit_with_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "eval_steps_env.py").write_text(STEP_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["eval", "--env", "eval_steps_env:make_env", "--num-problems", "2"]
    args += ["--samples-per-problem", "4", "--max-tokens", "4", "--no-progress"]
    args += ["--credit", "gigpo"]
    knobs = ["--gigpo.state-key", "observation", "--gigpo.gamma", "0.5", "--gigpo.omega", "0.3"]
    ludic_main([*args, *knobs, "--out-dir", "ev"])

    rollouts = read_rollouts_jsonl(tmp_path / "ev" / "rollouts.jsonl")
    credit = GiGPO(gamma=0.5, omega=0.3, anchor_key=_observation_anchor).details(rollouts)
    rows = [
        json.loads(line) for line in (tmp_path / "ev" / "credit.jsonl").read_text().splitlines()
    ]
    assert len(rows) == len(credit) == 2 * 4 * 3
    for row in rows:
        c = credit[(row["rollout_id"], row["turn_id"])]
        assert row["advantage"] == pytest.approx(c.advantage)
        assert row["anchor_group_size"] == c.anchor_group_size
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    # By observation text, turns 2 and 3 ("Again.") share an anchor: groups of 8 and 4.
    assert metrics["gigpo/anchored_turn_fraction"] == 1.0
    assert metrics["gigpo/mean_anchor_group_size"] == pytest.approx((8 * 4 + 16 * 8) / 24)
    assert metrics["gigpo/turns"] == 24 and metrics["episodes"] == 8

    ludic_main([*args, "--out-dir", "ev_env"])  # the env's state key
    by_env = json.loads((tmp_path / "ev_env" / "metrics.json").read_text())
    assert by_env["gigpo/mean_anchor_group_size"] == 4.0  # one anchor per turn index


def test_gigpo_flags_need_credit_gigpo_and_groups(tmp_path: Path) -> None:
    base = {"env": "tictactoe", "out_dir": tmp_path, "progress": False}
    with pytest.raises(ValueError, match="only with --credit gigpo"):
        run_eval_command(EvalConfig(**base, gigpo=GiGPOOptions(omega=0.5)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--samples-per-problem 2"):
        run_eval_command(EvalConfig(**base, credit="gigpo"))  # type: ignore[arg-type]
