"""One registry of presets for `ludic train`, `ludic actor` and `ludic learner`, and GiGPO's
knobs from the command line: each `--gigpo.*` flag of a real `ludic train` run changes the
weights the samples carry exactly as the credit formula says (the test fails if one is
ignored), and knobs given to a preset they do not belong to are refused."""

from __future__ import annotations

import hashlib
import json
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tyro

import ludic.training.algorithm as algorithm_module
from ludic.cli import main as ludic_main
from ludic.pipeline.commands import make_algorithm as pipeline_algorithm
from ludic.pipeline.config import ActorConfig, LearnerConfig
from ludic.recipes import algorithms
from ludic.recipes.configs import TrainConfig
from ludic.recipes.train import make_algorithm as train_algorithm
from ludic.rollouts.rollout_log import read_rollouts_jsonl
from ludic.training.credit import GiGPO, LeaveOneOutReturn, ReinforcePlusPlus
from ludic.training.losses import TokenClippedSurrogateLoss

STEP_ENV = '''
from ludic.envs import SingleAgentEnv
from ludic.types import StepOutcome


class Steps(SingleAgentEnv):
    """Up to three turns: reward 1 for a reply with an "o"; a reply with an "a" ends the
    episode early, so lengths vary; the turn count is the state key."""

    def env_reset(self, seed=None):
        self.turn = 0
        return "Start.", {}

    def env_step(self, action):
        self.turn += 1
        done = self.turn >= 3 or "a" in action
        return StepOutcome(obs="Again.", reward=float("o" in action), terminated=done)

    def env_state_key(self):
        return self.turn


def make_env():
    return Steps()
'''


def test_one_registry_for_every_command() -> None:
    names = set(algorithms.PRESETS)
    for config in (TrainConfig, ActorConfig, LearnerConfig):
        hint = typing.get_type_hints(config)["algorithm"]
        assert set(typing.get_args(hint)) == names, config.__name__
    presets = {n.removeprefix("make_") for n in algorithm_module.__all__ if n.startswith("make_")}
    assert presets - {"sft"} <= {n.removesuffix("_baseline") for n in names} | names
    train_cfg = TrainConfig(max_tokens=64)
    for name in names:
        assert train_algorithm(name, train_cfg).name == name  # type: ignore[arg-type]
        built = pipeline_algorithm(name, max_tokens=64)  # type: ignore[arg-type]
        assert built.name == name
        assert type(built.credit_assigner) is type(train_algorithm(name, train_cfg).credit_assigner)  # type: ignore[arg-type]


def test_learner_command_line_selects_the_new_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ludic.models import load_model, tiny_model_dir
    from ludic.pipeline import learner_run
    from ludic.pipeline.commands import _trainer
    from ludic.pipeline.versions import Forks

    model, tokenizer = load_model(tiny_model_dir(), dtype="float32")
    # no Redis here: the version record a learner reads at its start is not what is tested
    monkeypatch.setattr(learner_run, "fork_versions", lambda trainer, source, url: None)

    class Source:
        rank, world_size = 0, 1
        staleness = SimpleNamespace(forks=Forks())

    def learner(*args: str) -> Any:
        cfg = tyro.cli(LearnerConfig, args=[*args, "--out-dir", str(tmp_path)])
        trainer = _trainer(cfg, Source(), model, tokenizer, None)
        trainer.close()
        return trainer.algorithm

    assert isinstance(learner("--algorithm", "rloo").credit_assigner, LeaveOneOutReturn)
    pp = learner("--algorithm", "reinforce_pp_baseline").credit_assigner
    assert isinstance(pp, ReinforcePlusPlus) and pp.group_baseline
    gigpo = learner("--algorithm", "gigpo")
    assert gigpo.name == "gigpo" and isinstance(gigpo.loss, TokenClippedSurrogateLoss)
    dr = learner("--algorithm", "dr_grpo", "--max-tokens", "48").loss
    assert dr.constant_normalizer == 48.0
    with pytest.raises(ValueError, match="pass --max-tokens"):
        learner("--algorithm", "dr_grpo")


def test_actor_command_line_passes_gigpo_knobs_to_its_credit() -> None:
    args = ["--algorithm", "gigpo", "--gigpo.omega", "0.3", "--gigpo.gamma", "0.5"]
    args += ["--gigpo.default-step-reward", "-0.1", "--gigpo.episode-stat", "step_rows"]
    args += ["--gigpo.combine", "seed003", "--gigpo.no-normalize-std"]
    cfg = tyro.cli(ActorConfig, args=args)
    credit = pipeline_algorithm(cfg.algorithm, gigpo=cfg.gigpo).credit_assigner
    assert isinstance(credit, GiGPO)
    assert (credit.omega, credit.gamma, credit.default_step_reward) == (0.3, 0.5, -0.1)
    assert (credit.episode_stat, credit.combine, credit.normalize_std) == (
        "step_rows",
        "seed003",
        False,
    )


def test_gigpo_knobs_for_another_preset_are_refused() -> None:
    cfg = tyro.cli(TrainConfig, args=["--algorithm", "grpo", "--gigpo.omega", "0.5"])
    with pytest.raises(ValueError, match="apply only to --algorithm gigpo"):
        train_algorithm(cfg.algorithm, cfg)
    with pytest.raises(ValueError, match="state-key"):
        algorithms.GiGPOOptions(state_key="nonsense")
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        algorithms.make_algorithm("ppo")


def _observation_anchor(turn: Any) -> Any:
    if not turn.agent_steps:
        return None
    return hashlib.sha256(turn.observation.encode()).hexdigest()


KNOBS = {
    "omega": ("--gigpo.omega", "0.3", 0.3),
    "gamma": ("--gigpo.gamma", "0.5", 0.5),
    "default_step_reward": ("--gigpo.default-step-reward", "-0.2", -0.2),
    "episode_stat": ("--gigpo.episode-stat", "step_rows", "step_rows"),
    "normalize_std": ("--gigpo.no-normalize-std", None, False),
    "anchor_key": ("--gigpo.state-key", "observation", _observation_anchor),
}


@pytest.mark.slow
def test_ludic_train_gigpo_weights_follow_every_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train_steps_env.py").write_text(STEP_ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["train", "--env", "train_steps_env:make_env", "--algorithm", "gigpo", "--steps", "1"]
    args += ["--problems-per-step", "2", "--group-size", "4", "--max-tokens", "4"]
    args += ["--max-steps", "3", "--out-dir", "run", "--no-progress", "--seed", "2"]
    for flag, value, _ in KNOBS.values():
        args += [flag] if value is None else [flag, value]
    ludic_main(args)

    rollouts = read_rollouts_jsonl(tmp_path / "run" / "rollouts.jsonl")
    samples = [
        json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    ]
    weights = {(s["meta"]["rollout_id"], s["meta"]["turn_id"]): s["weight"] for s in samples}
    chosen = {name: v for name, (_, _, v) in KNOBS.items()}
    expected = GiGPO(**chosen).assign(rollouts)
    assert weights.keys() == expected.keys()
    assert list(weights.values()) == pytest.approx([expected[k] for k in weights], abs=1e-6)
    for name in KNOBS:  # each flag changes the weights of this very run
        without = GiGPO(**{k: v for k, v in chosen.items() if k != name}).assign(rollouts)
        assert any(abs(without[k] - expected[k]) > 1e-4 for k in expected), name
