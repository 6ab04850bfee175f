"""Evaluate a model at tic-tac-toe against the scripted opponent.

    python examples/tictactoe/eval.py --model ludic_runs/quickstart/rl/checkpoints/step_00000040/model
    python examples/tictactoe/eval.py --server-url http://127.0.0.1:8000 [http://127.0.0.1:8001 ...]

The model is a local Hugging Face directory (or a hub id, if you have network) served in
process by the embedded engine (batch-invariant, as the quickstart's, so a seeded evaluation
does not depend on what ran beside each game), or any OpenAI-compatible server (vLLM, SGLang,
`ludic serve`). By default it plays the quickstart's rules (`quickstart_env_kwargs`: an
illegal move costs a penalty and the model moves again, `--illegal-move retry`) and games, so on
a quickstart checkpoint it gives the numbers of the `ludic eval` line the quickstart prints.
Prints win / draw / loss / illegal rates and writes per-episode records for `ludic view`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import tyro

from ludic.envs.tictactoe import IllegalMovePolicy
from ludic.inference.client import ChatClient
from ludic.recipes import InferenceArgs, InferenceFlags, close_client, load_policy
from ludic.recipes.configs import QuickstartConfig
from ludic.recipes.tictactoe import (
    StageResult,
    evaluate_stage,
    print_results,
    quickstart_env_kwargs,
)

QUICKSTART = QuickstartConfig()


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    """Play `episodes` games against the scripted opponent and print the outcome rates. The
    defaults are the quickstart's (its env rules, evaluation games and sampling)."""

    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model, which plays badly)."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """In process on --model, or --server-url URL [URL ...] (games spread over the servers)."""
    opponent: Literal["random", "minimax", "mixed"] = field(
        default_factory=lambda: QUICKSTART.opponent
    )
    """Scripted opponent."""
    opponent_epsilon: float = field(default_factory=lambda: QUICKSTART.opponent_epsilon)
    """Random-move probability of the mixed opponent."""
    illegal_move: IllegalMovePolicy = field(default_factory=lambda: QUICKSTART.illegal_move)
    """What an illegal or unparseable move does: retry (a penalty, then the model moves again,
    as in the quickstart) or end (the game is lost at once)."""
    observation: Literal["compact", "full"] = field(default_factory=lambda: QUICKSTART.observation)
    """The env's observation text: it must match what the checkpoint was trained on (the
    quickstart trains on "compact"; "full" also explains the rules and lists legal moves)."""
    episodes: int = field(default_factory=lambda: QUICKSTART.eval_episodes)
    """Games to play (opponent seeds are fixed, so runs are comparable)."""
    temperature: float = field(default_factory=lambda: QUICKSTART.eval_temperature)
    """Sampling temperature (0: greedy)."""
    max_tokens: int = field(default_factory=lambda: QUICKSTART.max_tokens)
    """Token limit of one reply."""
    threads: int | None = field(default_factory=lambda: QUICKSTART.threads)
    """torch CPU threads of the in-process engine (None: torch's choice); the quickstart's
    numbers hold for its thread count."""
    out_dir: Path = Path("ludic_runs/tictactoe_eval")
    """Where episodes.jsonl, steps.jsonl, rollouts.jsonl and metrics.json go."""


def env_kwargs(cfg: EvalConfig) -> dict[str, Any]:
    """The quickstart's env kwargs with this evaluation's rule flags."""
    rules = replace(
        QUICKSTART,
        opponent=cfg.opponent,
        opponent_epsilon=cfg.opponent_epsilon,
        illegal_move=cfg.illegal_move,
        observation=cfg.observation,
    )
    return quickstart_env_kwargs(rules)


def make_client(cfg: EvalConfig) -> ChatClient:
    """The servers, else a batch-invariant embedded engine over the model, as the quickstart's."""
    if cfg.inference.server_url:
        return cfg.inference.make_client(cfg.model)
    import torch

    from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    policy, tokenizer = load_policy(cfg.model)
    return EmbeddedEngine(policy, tokenizer, config=EngineConfig(batch_invariant=True))


async def evaluate(cfg: EvalConfig) -> StageResult:
    client = make_client(cfg)
    try:
        return await _play(client, cfg)
    finally:
        await close_client(client)


async def _play(client: ChatClient, cfg: EvalConfig) -> StageResult:
    return await evaluate_stage(
        client,
        cfg.model or " ".join(cfg.inference.server_url or ()) or "tiny model",
        env_kwargs=env_kwargs(cfg),
        episodes=cfg.episodes,
        temperature=cfg.temperature,
        max_tokens=cfg.max_tokens,
        out_dir=cfg.out_dir,
        progress=True,
    )


def main(cfg: EvalConfig) -> StageResult:
    result = asyncio.run(evaluate(cfg))
    rules = f"illegal moves: {cfg.illegal_move}"
    print_results([result], title=f"Tic-tac-toe vs a {cfg.opponent} opponent ({rules})")
    view = f"ludic view {cfg.out_dir / 'rollouts.jsonl'}"
    if cfg.model and not cfg.inference.server_url:  # its tokens as text, as `ludic eval` prints
        view += f" --tokenizer {cfg.model}"
    print(f"episodes in {cfg.out_dir} ({view})")
    return result


if __name__ == "__main__":
    main(tyro.cli(EvalConfig))
