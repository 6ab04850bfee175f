"""A reference GRPO loop in one file, built only from Ludic's public components.

    python examples/grpo_reference.py --steps 30
    python examples/grpo_reference.py --model ludic_runs/quickstart/sft/checkpoints/step_00000300/model

What the `Trainer` does, written out: each step
  1. plays `groups` tic-tac-toe games `group_size` times each with the current policy
     (`RolloutEngine` + `GRPORequestStrategy`: same opponent seed, different sampling seeds),
  2. turns rewards into advantages, A_i = (R_i - mean_group R) / (std_group R + eps)
     (`GroupNormalizedReturn`), and every agent turn into one token sample (`generate_batch`),
  3. pads the samples into tensors (`collate`) and computes the policy's token logprobs,
  4. takes one AdamW step on the clipped surrogate
     -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) with r_t = pi(token) / pi_behaviour(token),
     averaged over each sample's tokens, then over samples (`TokenClippedSurrogateLoss`),
  5. copies the new weights into the inference engine (`EmbeddedEngine.update_weights`).
If this file has to grow to keep working, the library's API has grown too complex.
"""

from __future__ import annotations

import asyncio
import copy
import math
import statistics
from dataclasses import dataclass
from typing import Literal

import torch
import tyro
from transformers import PreTrainedModel

from ludic.agents import Agent
from ludic.context import LatestObservationContext
from ludic.envs import TicTacToeEnv
from ludic.eval import make_eval_requests, run_eval
from ludic.inference import SamplingConfig
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.interaction import SingleAgentProtocol
from ludic.models import build_tiny_model, load_model
from ludic.parsers import xml_tag_parser
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
    generate_batch,
)
from ludic.training import (
    GroupNormalizedReturn,
    LossInputs,
    TokenClippedSurrogateLoss,
    collate,
    seed_everything,
    token_logprobs,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """GRPO on tic-tac-toe against a scripted opponent, in one readable loop."""

    model: str | None = None
    """Local model directory (default: a fresh tiny model built from scratch)."""
    opponent: Literal["random", "minimax", "mixed"] = "random"
    """Scripted opponent."""
    observation: Literal["compact", "full"] = "compact"
    """The env's observation text: it must match what the checkpoint was trained on (the
    quickstart trains on "compact"; "full" also explains the rules and lists legal moves)."""
    steps: int = 30
    """Optimizer steps."""
    groups: int = 4
    """Games (opponent seeds) per step."""
    group_size: int = 8
    """Samples per game: the group whose mean reward is the baseline."""
    lr: float = 1e-3
    """AdamW learning rate."""
    clip_eps: float = 0.2
    """PPO clip range of the importance ratio."""
    max_grad_norm: float = 1.0
    """Gradient clipping."""
    max_tokens: int = 10
    """Token limit of one reply (`<move>5</move>` is 8 tokens)."""
    eval_games: int = 64
    """Games for the win rate before and after training."""
    seed: int = 0
    """Seeds everything."""


def make_protocol(engine: EmbeddedEngine, max_tokens: int) -> SingleAgentProtocol:
    """The agent harness: latest board only, `<move>N</move>` parser, up to 9 env steps."""
    agent = Agent(
        engine,
        context=LatestObservationContext(),
        parser=xml_tag_parser("move"),
        sampling=SamplingConfig(max_tokens=max_tokens),
        system_prompt="",
    )
    return SingleAgentProtocol(agent, max_steps=9)


async def win_rate(rollouts: RolloutEngine, cfg: Config) -> float:
    requests = make_eval_requests(
        env=ComponentSpec(
            name="tictactoe", kwargs={"opponent": cfg.opponent, "observation": cfg.observation}
        ),
        protocol=ComponentSpec(name="agent"),
        num_problems=cfg.eval_games,
        seed=1_000_000,
        sampling=SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens),
    )
    result = await run_eval(rollouts, requests)
    return result.metrics.get("outcome/win", 0.0)


def grpo_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: TokenClippedSurrogateLoss,
    samples: list,  # list[SAWItem]
    pad_token_id: int,
    max_grad_norm: float,
) -> dict[str, float]:
    """One optimizer step on a batch of samples (steps 3 and 4 of the module docstring)."""
    batch = collate(samples, pad_token_id=pad_token_id)
    model.train()
    logits_BTV = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits
    logprobs_BT, _ = token_logprobs(logits_BTV, batch.input_ids_BT)
    out = loss_fn(
        LossInputs(
            logprobs_BT=logprobs_BT,
            action_mask_BT=batch.action_mask_BT,
            advantages_B=batch.advantages_B,
            behavior_logprobs_BT=batch.behavior_logprobs_BT,
            total_action_tokens=float(batch.num_action_tokens),
            total_sequences=float(batch.num_sequences),
        )
    )
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return {"loss": float(out.loss.item()), "grad_norm": float(grad_norm), **out.metrics}


async def train(cfg: Config) -> tuple[float, float, list[float]]:
    seed_everything(cfg.seed)
    model: PreTrainedModel
    if cfg.model is None:
        model, tokenizer = build_tiny_model(seed=cfg.seed)
    else:
        model, tokenizer = load_model(cfg.model, dtype=torch.float32)
    engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)  # the served copy of the policy
    rollouts = RolloutEngine(
        env_registry={"tictactoe": TicTacToeEnv},
        protocol_registry={"agent": lambda: make_protocol(engine, cfg.max_tokens)},
    )
    credit = GroupNormalizedReturn(normalize_std=True)
    loss_fn = TokenClippedSurrogateLoss(
        clip_eps_low=cfg.clip_eps, clip_eps_high=cfg.clip_eps, aggregation="seq_mean_token_mean"
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    seeds = SeedSequencer(run_seed=cfg.seed)
    strategy = GRPORequestStrategy(group_size=cfg.group_size)
    game = ComponentSpec(
        name="tictactoe", kwargs={"opponent": cfg.opponent, "observation": cfg.observation}
    )
    sampling = SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens)
    pad_token_id = int(tokenizer.pad_token_id or 0)

    before = await win_rate(rollouts, cfg)
    rewards: list[float] = []
    for step in range(cfg.steps):
        # 1-2: play the groups, assign group-relative advantages, build one sample per turn.
        requests = [
            RolloutRequest(env=game, protocol=ComponentSpec(name="agent"), sampling=sampling)
            for _ in range(cfg.groups)
        ]
        batch = await generate_batch(
            rollouts, seeds.seed_requests(requests, step), credit, strategy=strategy
        )
        samples = [s for s in batch.samples if s.num_action_tokens > 0]
        stats = batch.stats  # mean_reward averages the successful episodes: 0.0 with none
        rewards.append(stats.mean_reward if stats.num_failed < stats.num_rollouts else math.nan)
        if not samples:
            print(
                f"step {step + 1:3d}  nothing to train on ({stats.num_failed} of "
                f"{stats.num_rollouts} episodes failed)"
            )
            continue
        # 3-4: one clipped-surrogate step on those samples.
        metrics = grpo_step(model, optimizer, loss_fn, samples, pad_token_id, cfg.max_grad_norm)
        # 5: serve the new policy (the version tags every later sample).
        engine.update_weights(model.state_dict(), version=step + 1)
        print(
            f"step {step + 1:3d}  mean reward {stats.mean_reward:+.2f}  "
            f"loss {metrics['loss']:+.4f}  grad norm {metrics['grad_norm']:.3f}"
        )
    after = await win_rate(rollouts, cfg)
    engine.close()
    return before, after, rewards


def main(cfg: Config) -> tuple[float, float, list[float]]:
    """Train; returns the win rates before and after, and each step's mean episode reward
    (NaN for a step whose every episode failed: no episode earned a reward)."""
    before, after, rewards = asyncio.run(train(cfg))
    earned = [r for r in rewards if not math.isnan(r)]
    none = f" ({len(rewards) - len(earned)} of {len(rewards)} steps left out: every episode failed)"
    if earned:
        k = max(1, len(earned) // 4)
        first, last = statistics.mean(earned[:k]), statistics.mean(earned[-k:])
        print(
            f"mean reward: first {k} steps {first:+.2f}, last {k} steps {last:+.2f}"
            + (none if len(earned) < len(rewards) else "")
        )
    elif rewards:
        print(f"mean reward: unknown{none}")
    print(f"win rate vs a {cfg.opponent} opponent: {before:.0%} before, {after:.0%} after")
    return before, after, rewards


if __name__ == "__main__":
    main(tyro.cli(Config))
