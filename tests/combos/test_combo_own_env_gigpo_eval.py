"""A user's own env file, run as README "Train your own environment" tells them, each command a
new process in the directory that holds `my_env.py`: `ludic train --env my_env:make` (a factory
function, not the class) with GiGPO credit finds the class's parser and context through the
factory and trains on step-level advantages of the env's state keys; a `--resume` that changes a
`--gigpo.*` knob is refused naming it and both values; `ludic eval` of the checkpoint at
`--temperature 0.7` samples every turn at that temperature from the checkpoint's weights and
writes GiGPO's per-turn credit; `ludic view` renders the training and the evaluation episodes."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from combo_processes import agent_steps, ludic, records, run

MY_ENV = """
import random
from ludic.envs import SingleAgentEnv
from ludic.types import ParseResult, StepOutcome

def lamp_parser(text):
    for char in text:
        if char in "1234":
            return ParseResult(action=char, reward=0.0)
    return ParseResult(action=None, reward=-0.2, obs="Reply with the number of one lamp, 1 to 4.")

class LightsEnv(SingleAgentEnv):
    parser = staticmethod(lamp_parser)
    system_prompt = "You control 4 lamps. Each turn, reply with one lamp number."
    suggested_context = "latest"

    def env_reset(self, seed=None):
        rng = random.Random(seed)
        self.lamps = [rng.random() < 0.5 for _ in range(4)]
        if all(self.lamps):
            self.lamps[rng.randrange(4)] = False
        return self.describe(), {}

    def env_step(self, action):
        lamp = int(action) - 1
        self.lamps[lamp] = not self.lamps[lamp]
        if all(self.lamps):
            return StepOutcome(obs="All lamps are on.", reward=0.95, terminated=True)
        return StepOutcome(obs=self.describe(), reward=-0.05)

    def env_state_key(self):
        return "".join("1" if on else "0" for on in self.lamps)

    def describe(self):
        lamps = ", ".join(f"{i + 1} {'on' if on else 'off'}" for i, on in enumerate(self.lamps))
        return f"Lamps: {lamps}. Which lamp do you flip?"

def make():
    return LightsEnv()
"""
SHAPE = ("--max-tokens", "6", "--max-steps", "4", "--no-progress")
TRAIN = (
    *("train", "--env", "my_env:make", "--algorithm", "gigpo", "--problems-per-step", "2"),
    *("--group-size", "4", "--lr", "1e-3", "--checkpoint-every", "1", "--out-dir", "run"),
    *SHAPE,
)
CHECKPOINT = "run/checkpoints/step_00000002"


def _run(cwd: Path, *args: str, code: int = 0) -> str:
    return run(ludic(*args), cwd, code=code)


def _check_training(cwd: Path) -> None:
    said = _run(cwd, *TRAIN, "--steps", "2")
    assert "parser: lamp_parser (--parser auto)" in said  # found through the factory
    assert "context: latest (--context auto: the env's suggested_context)" in said
    samples = records(cwd / "run" / "samples.jsonl")
    assert {s["meta"]["sample_mode"] for s in samples} == {"turn"}
    assert all(len(s["meta"]["state_key"]) == 4 for s in samples)
    weights: dict[str, set[float]] = defaultdict(set)
    for sample in samples:
        weights[sample["meta"]["rollout_id"]].add(round(sample["weight"], 6))
    # Step-level credit: the turns of one episode are weighted apart, not by one episode value.
    assert any(len(w) > 1 for w in weights.values()), weights


def _check_gigpo_change_refused(cwd: Path) -> None:
    said = _run(cwd, *TRAIN, "--steps", "3", "--resume", "--gigpo.gamma", "0.5", code=1)
    assert "--gigpo.gamma" in said and "0.5" in said and "0.95" in said, said
    assert len(records(cwd / "run" / "metrics.jsonl")) == 2  # nothing trained or logged


def _check_eval(cwd: Path) -> None:
    _run(
        cwd,
        *("eval", "--env", "my_env:make", "--model", CHECKPOINT, "--temperature", "0.7"),
        *("--credit", "gigpo", "--num-problems", "3", "--samples-per-problem", "2"),
        *("--out-dir", "eval", *SHAPE),
    )
    steps = agent_steps(cwd / "eval" / "rollouts.jsonl")
    assert {s["trace"]["sampling"]["temperature"] for s in steps} == {0.7}
    assert {s["policy_version"] for s in steps} == {2}  # the checkpoint's weights
    metrics = json.loads((cwd / "eval" / "metrics.json").read_text())
    assert metrics["episodes"] == 6 and metrics["gigpo/turns"] == len(steps)
    credit = records(cwd / "eval" / "credit.jsonl")
    assert sorted(c["turn_id"] for c in credit) == sorted(s["turn_id"] for s in steps)


def _check_view(cwd: Path) -> None:
    for rollouts, extra in (
        ("run/rollouts.jsonl", ["--samples", "run/samples.jsonl"]),
        ("eval/rollouts.jsonl", []),
    ):
        said = _run(cwd, "view", rollouts, *extra, "--tokenizer", CHECKPOINT, "--out", "v.html")
        assert "warn" not in said.lower(), said
        html = (cwd / "v.html").read_text()
        assert all(r["id"] in html for r in records(cwd / rollouts)), rollouts


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a chain of launches; the shared CI box is slow
def test_own_env_factory_trained_with_gigpo_evaluated_at_temperature_and_viewed(
    tmp_path: Path,
) -> None:
    (tmp_path / "my_env.py").write_text(MY_ENV)
    _check_training(tmp_path)
    _check_gigpo_change_refused(tmp_path)
    _check_eval(tmp_path)
    _check_view(tmp_path)
