"""Evaluate a model at tic-tac-toe against the scripted opponent.

    python examples/tictactoe/eval.py --model ludic_runs/quickstart/rl/checkpoints/step_00000040/model
    python examples/tictactoe/eval.py --server-url http://127.0.0.1:8000 [http://127.0.0.1:8001 ...]

The model is a local Hugging Face directory (or a hub id, if you have network) served in
process by the embedded engine, or any OpenAI-compatible server (vLLM, SGLang, `ludic serve`).
Prints win / draw / loss / illegal rates and writes per-episode records for `ludic view`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from ludic.inference.client import ChatClient
from ludic.recipes import InferenceArgs, InferenceFlags, close_client
from ludic.recipes.tictactoe import StageResult, evaluate_stage, print_results


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    """Play `episodes` games against the scripted opponent and print the outcome rates."""

    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model, which plays badly)."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """In process on --model, or --server-url URL [URL ...] (games spread over the servers)."""
    opponent: Literal["random", "minimax", "mixed"] = "random"
    """Scripted opponent."""
    observation: Literal["compact", "full"] = "compact"
    """The env's observation text: it must match what the checkpoint was trained on (the
    quickstart trains on "compact"; "full" also explains the rules and lists legal moves)."""
    episodes: int = 100
    """Games to play (opponent seeds are fixed, so runs are comparable)."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    max_tokens: int = 10
    """Token limit of one reply."""
    out_dir: Path = Path("ludic_runs/tictactoe_eval")
    """Where episodes.jsonl, steps.jsonl, rollouts.jsonl and metrics.json go."""


async def evaluate(cfg: EvalConfig) -> StageResult:
    client = cfg.inference.make_client(cfg.model)  # the servers, else the model in process
    try:
        return await _play(client, cfg)
    finally:
        await close_client(client)


async def _play(client: ChatClient, cfg: EvalConfig) -> StageResult:
    return await evaluate_stage(
        client,
        cfg.model or " ".join(cfg.inference.server_url or ()) or "tiny model",
        env_kwargs={"opponent": cfg.opponent, "observation": cfg.observation},
        episodes=cfg.episodes,
        temperature=cfg.temperature,
        max_tokens=cfg.max_tokens,
        out_dir=cfg.out_dir,
        progress=True,
    )


def main(cfg: EvalConfig) -> StageResult:
    result = asyncio.run(evaluate(cfg))
    print_results([result], title=f"Tic-tac-toe vs a {cfg.opponent} opponent")
    print(f"episodes in {cfg.out_dir} (ludic view {cfg.out_dir / 'rollouts.jsonl'})")
    return result


if __name__ == "__main__":
    main(tyro.cli(EvalConfig))
