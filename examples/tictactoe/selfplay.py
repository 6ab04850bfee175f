"""Self-play: two LLM agents play tic-tac-toe against each other and one policy learns from both.

    python examples/tictactoe/selfplay.py
    python examples/tictactoe/selfplay.py --model ludic_runs/quickstart/rl/checkpoints/step_00000040/model
    python examples/tictactoe/selfplay.py --model DIR --server-url http://127.0.0.1:8000 --server-token secret

`TicTacToeDuelEnv` has two seats, X and O. `MultiAgentProtocol` runs one `Agent` per seat (both
on the same client: the same policy) and returns one rollout per seat, each with that seat's
own reward. GRPO groups rollouts by seat and game, so X is compared with X and O with O; every
rollout trains the one shared model. Prints the outcome rates of 64 games before and after.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from ludic.agents import Agent
from ludic.context import LatestObservationContext
from ludic.envs import TicTacToeDuelEnv
from ludic.inference import ChatClient, SamplingConfig
from ludic.interaction import MultiAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.recipes import (
    InferenceArgs,
    InferenceFlags,
    finish,
    load_policy,
    make_trainer,
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
from ludic.types import Rollout


@dataclass(frozen=True, kw_only=True, slots=True)
class SelfPlayConfig:
    """GRPO self-play on TicTacToeDuelEnv (seats X and O share one policy)."""

    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model)."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """Where rollouts are generated: in process, or --server-url URL [URL ...] (weights are
    pushed to every server after each step; needs --server-token)."""
    observation: Literal["compact", "full"] = "compact"
    """The env's observation text: it must match what the checkpoint was trained on (the
    quickstart trains on "compact"; "full" also explains the rules and lists legal moves)."""
    steps: int = 20
    """Optimizer steps."""
    games: int = 4
    """Games per step."""
    group_size: int = 4
    """Samples per game (GRPO groups, per seat)."""
    eval_games: int = 64
    """Games played before and after training to report the outcome rates."""
    lr: float = 1e-3
    """Learning rate (for the tiny model; ~1e-6 for a real LLM)."""
    max_tokens: int = 10
    """Token limit of one reply."""
    seed: int = 0
    """Seeds training and sampling."""
    device: str = "cpu"
    """Training device."""
    out_dir: Path = Path("ludic_runs/tictactoe_selfplay")
    """Where metrics.jsonl and checkpoints go (refused when it holds an earlier run's
    checkpoints: pass another one for a new run)."""


def make_protocol(client: ChatClient, max_tokens: int) -> MultiAgentProtocol:
    agents = {
        seat: Agent(
            client,
            context=LatestObservationContext(),
            parser=xml_tag_parser("move"),
            sampling=SamplingConfig(max_tokens=max_tokens),
            system_prompt="",
        )
        for seat in ("X", "O")
    }
    return MultiAgentProtocol(agents, max_steps=20)


def outcome_rates(rollouts: list[Rollout]) -> dict[str, float]:
    """Share of games X won, O won, drawn, or lost by an illegal or missing move."""
    counts: collections.Counter[str] = collections.Counter()
    games = [r for r in rollouts if r.agent_id == "X"]
    for rollout in games:
        last = rollout.env_steps[-1] if rollout.env_steps else None
        outcome = None if last is None else last.info.get("outcome")
        label = {"win": "X wins", "loss": "O wins", "draw": "draw"}.get(str(outcome), "illegal")
        if outcome == "win" and last is not None and last.info.get("opponent_illegal_move"):
            label = "illegal"
        counts[label] += 1
    return {k: counts[k] / max(1, len(games)) for k in ("X wins", "O wins", "draw", "illegal")}


async def selfplay(cfg: SelfPlayConfig) -> tuple[dict[str, float], dict[str, float]]:
    check_count_flags(  # --steps 0 saved a step-0 checkpoint that refused the next run
        ("--steps", cfg.steps, "optimizer steps, e.g. 20"),
        ("--games", cfg.games, "games per step, e.g. 4"),
        ("--group-size", cfg.group_size, "samples per game, e.g. 4"),
    )
    # Before the model loads: a second run here would overwrite the first one's checkpoints.
    refuse_earlier_checkpoints(
        cfg.out_dir, fix=f"Pass another --out-dir for a new run (or delete {cfg.out_dir})."
    )
    model, tokenizer = load_policy(cfg.model, seed=cfg.seed, device=cfg.device)
    algorithm = make_grpo()
    sampling = SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens)
    duel = ComponentSpec(name="duel", kwargs={"observation": cfg.observation})
    inference = cfg.inference.make(model, tokenizer, device=cfg.device)
    try:
        rollouts = RolloutEngine(
            env_registry={"duel": TicTacToeDuelEnv},
            protocol_registry={"selfplay": lambda: make_protocol(inference.client, cfg.max_tokens)},
        )

        def requests(n: int) -> list[RolloutRequest]:
            protocol = ComponentSpec(name="selfplay")
            return [
                RolloutRequest(env=duel, protocol=protocol, sampling=sampling) for _ in range(n)
            ]

        async def evaluate() -> dict[str, float]:
            seeded = SeedSequencer(run_seed=cfg.seed + 1).seed_requests(requests(cfg.eval_games), 0)
            return outcome_rates(await rollouts.run(seeded))

        before = await evaluate()
        source = RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: requests(cfg.games),
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
        await trainer.train(cfg.steps)
        finish(trainer)
        after = await evaluate()
    finally:
        await inference.aclose()
    return before, after


def main(cfg: SelfPlayConfig) -> tuple[dict[str, float], dict[str, float]]:
    before, after = asyncio.run(selfplay(cfg))
    for name, rates in (("before", before), ("after", after)):
        print(f"{name:>6}: " + "  ".join(f"{k} {v:.0%}" for k, v in rates.items()))
    return before, after


if __name__ == "__main__":
    main(tyro.cli(SelfPlayConfig))
