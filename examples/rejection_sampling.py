"""Rejection sampling: play episodes, keep the good ones, write them as JSONL for SFT.

    python examples/rejection_sampling.py --expert --out data/tictactoe_expert.jsonl
    python examples/rejection_sampling.py --env math_qa --model DIR --samples-per-problem 8
    python examples/rejection_sampling.py --env math_qa --server-url http://127.0.0.1:8000

Episodes come from a model (a local directory or hub id, in process) or an OpenAI-compatible
server, or, for tic-tac-toe, from a scripted minimax expert (`--expert`) whose replies are
tokenised with the model's own tokenizer, so the kept rollouts train that model exactly.
Every rollout carries its token ids; `examples/sft_from_jsonl.py` (or `ludic sft`) trains on
the kept ones.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import tyro

from ludic.agents import Agent
from ludic.context import LatestObservationContext
from ludic.eval.command import parse_env_kwargs
from ludic.eval.env_spec import check_env_kwargs, resolve_env_factory, resolve_parser
from ludic.inference import ChatClient, SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.recipes import InferenceArgs, InferenceFlags, close_client, load_policy
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
    write_rollouts_jsonl,
)
from ludic.types import Rollout


@dataclass(frozen=True, kw_only=True, slots=True)
class RejectionSamplingConfig:
    """Generate episodes and keep those whose total reward reaches --min-reward."""

    env: str = "tictactoe"
    """Built-in env name or `module:factory`."""
    env_kwargs: str | None = None
    """JSON keyword arguments for the env (default: '{"opponent": "random"}' for tictactoe,
    none for any other env)."""
    model: str | None = None
    """Local model directory or hub id (default: a fresh tiny model); with --expert only its
    tokenizer is used."""
    inference: InferenceFlags = field(default_factory=InferenceArgs)
    """In process on --model, or --server-url URL [URL ...] (episodes spread over them)."""
    expert: bool = False
    """Tic-tac-toe only: a scripted minimax player writes the replies."""
    expert_epsilon: float = 0.3
    """Probability that the expert plays a random legal move."""
    problems: int = 64
    """Distinct problems (env seeds)."""
    samples_per_problem: int = 1
    """Episodes per problem."""
    min_reward: float = 0.0
    """Keep episodes whose total reward is at least this (tic-tac-toe: 0 keeps wins and draws)."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_tokens: int = 256
    """Token limit per model call."""
    max_steps: int = 9
    """Env steps per episode."""
    seed: int = 0
    """Seeds problems and sampling."""
    out: Path = Path("ludic_runs/rejection_sampling/kept.jsonl")
    """Kept rollouts (JSONL); all rollouts go next to it as *.all.jsonl."""


def make_client(cfg: RejectionSamplingConfig) -> ChatClient:
    if cfg.expert:
        from ludic.recipes.expert import PolicyClient
        from ludic.recipes.tictactoe import expert_policy

        if cfg.env != "tictactoe":
            raise ValueError("--expert plays tic-tac-toe only; use --env tictactoe")
        _, tokenizer = load_policy(cfg.model, seed=cfg.seed)
        return PolicyClient(expert_policy(cfg.expert_epsilon), tokenizer)
    return cfg.inference.make_client(cfg.model, seed=cfg.seed)  # servers, else in process


def env_kwargs(cfg: RejectionSamplingConfig) -> dict[str, object]:
    """--env-kwargs, else the default of --env (tic-tac-toe's random opponent; nothing else)."""
    if cfg.env_kwargs is None:
        return {"opponent": "random"} if cfg.env == "tictactoe" else {}
    return parse_env_kwargs(cfg.env_kwargs)


async def sample(cfg: RejectionSamplingConfig, client: ChatClient) -> list[Rollout]:
    env_factory = resolve_env_factory(cfg.env)
    parser = resolve_parser("auto", env_factory)
    sampling = SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens)

    def protocol() -> SingleAgentProtocol:
        agent = Agent(client, context=LatestObservationContext(), parser=parser, sampling=sampling)
        return SingleAgentProtocol(agent, max_steps=cfg.max_steps)

    engine = RolloutEngine(
        env_registry={"env": env_factory}, protocol_registry={"agent": protocol}, progress=True
    )
    env = ComponentSpec(name="env", kwargs=env_kwargs(cfg))
    requests = [
        RolloutRequest(env=env, protocol=ComponentSpec(name="agent"), sampling=sampling)
        for _ in range(cfg.problems)
    ]
    requests = SeedSequencer(run_seed=cfg.seed).seed_requests(requests, batch_index=0)
    expanded = GRPORequestStrategy(group_size=cfg.samples_per_problem).expand(requests)
    return await engine.run(expanded)


def main(cfg: RejectionSamplingConfig) -> tuple[Path, int, int]:
    # as `ludic train` and `ludic eval`: a wrong --env-kwargs is refused before the model loads
    check_env_kwargs(resolve_env_factory(cfg.env), env_kwargs(cfg))

    async def run() -> list[Rollout]:
        client = make_client(cfg)  # inside the event loop: an HTTP client is bound to it
        try:
            return await sample(cfg, client)
        finally:
            await close_client(client)

    rollouts = asyncio.run(run())
    kept = [r for r in rollouts if not r.failed and r.total_reward >= cfg.min_reward]
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    with cfg.out.open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(kept, f)
    with cfg.out.with_suffix(".all.jsonl").open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(rollouts, f)
    print(f"kept {len(kept)} of {len(rollouts)} episodes (total reward >= {cfg.min_reward})")
    if kept:
        print(f"wrote {cfg.out}; train on it: python examples/sft_from_jsonl.py --data {cfg.out}")
    else:
        print(nothing_kept(cfg, rollouts))
    return cfg.out, len(kept), len(rollouts)


def nothing_kept(cfg: RejectionSamplingConfig, rollouts: list[Rollout]) -> str:
    """Why no episode was kept and what to change (an empty file trains nothing)."""
    everything = cfg.out.with_suffix(".all.jsonl")
    failed = [r for r in rollouts if r.failed]
    if failed and len(failed) == len(rollouts):
        error = failed[0].meta.get("error", "no error recorded")
        return f"every episode failed (the first: {error}); all episodes are in {everything}"
    best = max((r.total_reward for r in rollouts if not r.failed), default=None)
    return (
        f"{cfg.out} is empty: nothing to train on (best total reward {best}). Lower "
        "--min-reward, sample more (--problems, --samples-per-problem), or let the scripted "
        f"expert play (--expert, tic-tac-toe); all episodes are in {everything}"
    )


if __name__ == "__main__":
    main(tyro.cli(RejectionSamplingConfig))
