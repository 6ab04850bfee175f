"""AWR vs rejection-sampled SFT on the quickstart's expert data, from the same tiny model.

    python examples/awr_tictactoe.py
    python examples/awr_tictactoe.py --seeds 3 --beta 0.5

A scripted expert (minimax with random moves, as in `ludic quickstart`) plays tic-tac-toe and
every game is stored (`expert/all.jsonl`). Two runs start from the same random tiny model:
  sft: `ludic sft --data all.jsonl --min-reward 0`: keep wins and draws, imitate them (weight 1);
  awr: `ludic sft --data all.jsonl --algorithm awr`: keep every game, weigh each turn by
       min(exp(A / beta), max_weight), A its game's return minus the mean return of games that
       started from the same board (`AWRCredit`, baseline "group").
Both runs use the same steps, batch size and learning rate; each is evaluated on the same
opponent seeds. The example prints and returns both evaluations (one row per seed and method).
"""

from __future__ import annotations

import asyncio
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import tyro
from rich.console import Console

from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.models import TinyModelSpec, build_tiny_model, load_model, save_model
from ludic.recipes.configs import SFTConfig
from ludic.recipes.expert import PolicyClient
from ludic.recipes.sft import sft_command
from ludic.recipes.tictactoe import (
    ENV_NAME,
    PROTOCOL_NAME,
    StageResult,
    evaluate_stage,
    expert_policy,
    print_results,
    rollout_engine,
)
from ludic.rollouts import ComponentSpec, RolloutRequest, SeedSequencer, write_rollouts_jsonl


@dataclass(frozen=True, kw_only=True, slots=True)
class AWRConfig:
    """AWR on all expert games vs SFT on the kept (won or drawn) ones."""

    expert_episodes: int = 256
    """Games the scripted expert plays (all stored; SFT keeps wins and draws)."""
    expert_epsilon: float = 0.3
    """Probability that the expert plays a random legal move."""
    opponent: Literal["random", "minimax", "mixed"] = "random"
    """Scripted opponent of the expert and of the evaluations."""
    steps: int = 40
    """Optimizer steps of each run."""
    batch_size: int = 32
    """Samples (turns) per step."""
    lr: float = 3e-3
    """Learning rate (suits the tiny model)."""
    beta: float = 0.5
    """AWR temperature."""
    max_weight: float = 20.0
    """AWR weight cap."""
    baseline: Literal["group", "mean", "state"] = "group"
    """AWR baseline (see `ludic sft --help`): group, mean, or state (the other visits of the
    turn's board)."""
    state_prior: float = 1.0
    """With baseline state: pseudo-visits of the data's mean in each board's value."""
    eval_episodes: int = 128
    """Evaluation games per run (the same opponent seeds for every run)."""
    eval_temperature: float = 1.0
    """Sampling temperature of the evaluated policy."""
    hidden_size: int = 128
    """Tiny model width (as the quickstart)."""
    num_layers: int = 2
    """Tiny model depth (as the quickstart)."""
    seeds: int = 2
    """Repeat everything (model init, data, training) with seeds 0 .. seeds - 1."""
    out_dir: Path = Path("ludic_runs/awr_tictactoe")
    """Where data, runs and results.json go."""


def env_kwargs(cfg: AWRConfig) -> dict[str, str]:
    """As the quickstart: an illegal move costs -1 and the agent tries again."""
    return {"opponent": cfg.opponent, "illegal_move": "retry"}


async def expert_data(cfg: AWRConfig, tokenizer: object, seed: int, out: Path) -> Path:
    """Every game the expert plays, as a rollouts JSONL."""
    client = PolicyClient(expert_policy(cfg.expert_epsilon), tokenizer)
    engine = rollout_engine(client, max_tokens=10)
    requests = [
        RolloutRequest(
            env=ComponentSpec(name=ENV_NAME, kwargs=env_kwargs(cfg)),
            protocol=ComponentSpec(name=PROTOCOL_NAME),
        )
        for _ in range(cfg.expert_episodes)
    ]
    rollouts = await engine.run(SeedSequencer(run_seed=seed).seed_requests(requests, 0))
    out.mkdir(parents=True, exist_ok=True)
    path = out / "all.jsonl"
    with path.open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(rollouts, f)
    return path


def train(cfg: AWRConfig, method: str, data: Path, init: Path, seed: int, out: Path) -> Path:
    """One `ludic sft` run (as the CLI would run it); returns the trained model directory."""
    sft = SFTConfig(
        data=data,
        model=str(init),
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        min_reward=0.0 if method == "sft" else None,
        algorithm="awr" if method == "awr" else "sft",
        awr_beta=cfg.beta,
        awr_max_weight=cfg.max_weight,
        awr_baseline=cfg.baseline,
        awr_state_prior=cfg.state_prior,
        seed=seed,
        out_dir=out,
        progress=False,
    )
    return sft_command(sft).checkpoint / "model"


async def evaluate(cfg: AWRConfig, model_dir: Path, stage: str) -> StageResult:
    model, tokenizer = load_model(model_dir)
    with EmbeddedEngine(model, tokenizer) as engine:
        return await evaluate_stage(
            engine,
            stage,
            env_kwargs=env_kwargs(cfg),
            episodes=cfg.eval_episodes,
            temperature=cfg.eval_temperature,
        )


def run_seed(cfg: AWRConfig, seed: int) -> list[StageResult]:
    out = cfg.out_dir / f"seed_{seed}"
    spec = TinyModelSpec(
        hidden_size=cfg.hidden_size,
        intermediate_size=3 * cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
    )
    model, tokenizer = build_tiny_model(seed=seed, spec=spec)
    init = save_model(model, tokenizer, out / "init")
    data = asyncio.run(expert_data(cfg, tokenizer, seed, out / "expert"))
    results = []
    for method in ("sft", "awr"):
        trained = train(cfg, method, data, init, seed, out / method)
        results.append(asyncio.run(evaluate(cfg, trained, f"{method} (seed {seed})")))
    return results


def main(cfg: AWRConfig) -> dict[str, list[StageResult]]:
    """Both methods' evaluations, one per seed: {"sft": [...], "awr": [...]}."""
    by_method: dict[str, list[StageResult]] = {"sft": [], "awr": []}
    for seed in range(cfg.seeds):
        sft, awr = run_seed(cfg, seed)
        by_method["sft"].append(sft)
        by_method["awr"].append(awr)
    print_results([*by_method["sft"], *by_method["awr"]], title="AWR vs rejection-sampled SFT")
    summary = {
        method: {
            "win": statistics.mean(r.win for r in results),
            "win+draw": statistics.mean(r.win + r.draw for r in results),
            "illegal": statistics.mean(r.illegal for r in results),
            "mean_reward": statistics.mean(r.mean_reward for r in results),
        }
        for method, results in by_method.items()
    }
    Console().print(summary)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "summary": summary,
        "runs": {m: [r.to_dict() for r in rs] for m, rs in by_method.items()},
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
    }
    (cfg.out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    return by_method


if __name__ == "__main__":
    main(tyro.cli(AWRConfig))
