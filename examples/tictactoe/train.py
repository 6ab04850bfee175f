"""Train an LLM at tic-tac-toe against the scripted opponent with GRPO.

    python examples/tictactoe/train.py                       # tiny model, embedded engine, CPU
    python examples/tictactoe/train.py --model ludic_runs/quickstart/sft/checkpoints/step_00000300/model
    # inference on a server (here `ludic serve`, or vLLM with Ludic's extension), training here:
    ludic serve --model DIR --token secret &
    python examples/tictactoe/train.py --model DIR --server-url http://127.0.0.1:8000 --server-token secret

The agent sees the latest board only (LatestObservationContext) and answers `<move>N</move>`.
Each step plays `groups` games x `group_size` samples, assigns GRPO advantages within each
group, takes one optimizer step and pushes the new weights to inference.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from ludic.agents import Agent
from ludic.context import LatestObservationContext
from ludic.envs import TicTacToeEnv
from ludic.inference import ChatClient, SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.recipes import (
    InferenceArgs,
    InferenceFlags,
    closing_rewards,
    finish,
    load_policy,
    make_trainer,
    plot_curve,
    refuse_earlier_checkpoints,
)
from ludic.recipes.count_checks import check_count_flags
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import RolloutBatchSource, make_grpo


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """GRPO on TicTacToeEnv against a scripted opponent."""

    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model)."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """Where rollouts are generated: in process, or --server-url URL [URL ...] (weights are
    pushed to every server after each step; needs --server-token)."""
    opponent: Literal["random", "minimax", "mixed"] = "random"
    """Scripted opponent."""
    observation: Literal["compact", "full"] = "compact"
    """The env's observation text: it must match what the checkpoint was trained on (the
    quickstart trains on "compact"; "full" also explains the rules and lists legal moves)."""
    steps: int = 40
    """Optimizer steps."""
    groups: int = 4
    """Games (opponent seeds) per step."""
    group_size: int = 8
    """Samples per game (the GRPO group)."""
    lr: float = 1e-3
    """Learning rate (1e-3 suits the tiny model; use ~1e-6 for a real LLM)."""
    max_tokens: int = 10
    """Token limit of one reply."""
    seed: int = 0
    """Seeds training, opponent seeds and sampling."""
    device: str = "cpu"
    """Training device."""
    out_dir: Path = Path("ludic_runs/tictactoe_train")
    """Where metrics.jsonl, rollouts.jsonl, checkpoints and reward_curve.png go (refused when it
    holds an earlier run's checkpoints: pass another one for a new run)."""


def make_protocol(client: ChatClient, max_tokens: int) -> SingleAgentProtocol:
    agent = Agent(
        client,
        context=LatestObservationContext(),
        parser=xml_tag_parser("move"),
        sampling=SamplingConfig(max_tokens=max_tokens),
        system_prompt="",  # the observation says how to reply: no system prompt
    )
    return SingleAgentProtocol(agent, max_steps=9)


async def train(cfg: TrainConfig) -> tuple[list[dict[str, float]], Path]:
    """Each step's metrics and the final checkpoint."""
    check_count_flags(  # --steps 0 saved a step-0 checkpoint that refused the next run
        ("--steps", cfg.steps, "optimizer steps, e.g. 40"),
        ("--groups", cfg.groups, "games per step, e.g. 4"),
        ("--group-size", cfg.group_size, "samples per game, e.g. 8"),
    )
    # Before the model loads: a second run here would overwrite the first one's checkpoints.
    refuse_earlier_checkpoints(
        cfg.out_dir, fix=f"Pass another --out-dir for a new run (or delete {cfg.out_dir})."
    )
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed, device=cfg.device)
    inference = cfg.inference.make(model, tokenizer, device=cfg.device)
    algorithm = make_grpo()
    sampling = SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens)
    rollouts = RolloutEngine(
        env_registry={"tictactoe": TicTacToeEnv},
        protocol_registry={"agent": lambda: make_protocol(inference.client, cfg.max_tokens)},
        jsonl_log=cfg.out_dir / "rollouts.jsonl",
    )
    game = ComponentSpec(
        name="tictactoe", kwargs={"opponent": cfg.opponent, "observation": cfg.observation}
    )
    source = RolloutBatchSource(
        engine=rollouts,
        requests_fn=lambda: [
            RolloutRequest(env=game, protocol=ComponentSpec(name="agent"), sampling=sampling)
            for _ in range(cfg.groups)
        ],
        credit_assigner=algorithm.credit_assigner,
        strategy=GRPORequestStrategy(group_size=cfg.group_size),
        seed_sequencer=SeedSequencer(run_seed=cfg.seed),
    )
    trainer = make_trainer(
        model,
        tokenizer,
        algorithm,
        source,
        out=cfg.out_dir,
        lr=cfg.lr,
        seed=cfg.seed,
        publisher=inference.publisher,
        device=cfg.device,
    )
    try:
        history = await trainer.train(cfg.steps)
        checkpoint = finish(trainer)
    finally:
        await inference.aclose()
    return history, checkpoint


def main(cfg: TrainConfig) -> list[dict[str, float]]:
    history, checkpoint = asyncio.run(train(cfg))
    curve = plot_curve(
        cfg.out_dir / "metrics.jsonl", cfg.out_dir / "reward_curve.png", "batch/mean_reward"
    )
    if history:  # a step whose every episode failed logs reward 0.0: no reward, left out
        rewards, _, _ = closing_rewards(history, checkpoint)
        print(f"mean episode reward {rewards}")  # as `ludic train` says it
    print(f"reward curve: {curve}; checkpoints: {cfg.out_dir / 'checkpoints'}")
    return history


if __name__ == "__main__":
    main(tyro.cli(TrainConfig))
