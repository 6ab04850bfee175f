"""A delegating agent and its sub-agent, one policy, trained together from one run.

    python examples/delegation/train.py
    python examples/delegation/train.py --mode inherit --rl-steps 20

The boss is asked for the successor of a number and must get it from a helper: it calls the
external tool `delegate(task, agent="helper")`, `DelegatingProtocol` runs the helper's episode
(a `TaskEnv` whose judge checks the helper's answer), and the boss answers `<move>N</move>`
(reward 1 if right). Both roles are played by the same tiny model with different prompts.

Stages: a scripted expert (right with probability 1 - epsilon) plays both roles and the tiny
model is fine-tuned on its boss and helper turns (SFT); then GRPO runs on the served model
with `HierarchicalCredit`: the boss's turns get their group advantage (groups of boss episodes
on the same number), the helper's turns theirs (helper episodes of the same group, never mixed
with the boss's), mixed with the boss's delegating-turn advantage per `--mode` / `--mix`.
Each batch holds both roles' samples, so one optimizer step trains both.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from ludic.agents import Agent, ToolAgent
from ludic.context import LatestObservationContext
from ludic.distributed import InProcessPublisher
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.client import ChatClient
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import DelegatingProtocol, SubAgentSpec, TaskEnv, delegate
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.parsers import xml_tag_parser
from ludic.recipes import finish, make_trainer, refuse_earlier_checkpoints
from ludic.recipes.expert import PolicyClient
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
    write_rollouts_jsonl,
)
from ludic.training import (
    HierarchicalCredit,
    OfflineBatchSource,
    RLAlgorithm,
    RolloutBatchSource,
    make_grpo,
    make_sft,
)
from ludic.training.credit import HierarchyMode
from ludic.types import Info, Message, Rollout, StepOutcome

MOVE = xml_tag_parser("move")
HELPER = "helper"
NUMBER = re.compile(r"successor of (\d+)")
MAX_TOKENS = 64  # the delegate call is ~45 tokens with the tiny tokenizer


@dataclass(frozen=True, kw_only=True, slots=True)
class DelegationConfig:
    """SFT warm start on scripted demonstrations, then GRPO with hierarchical credit."""

    mode: HierarchyMode = "mix"
    """How helper turns are credited: inherit (the boss's delegating-turn advantage), own (the
    helper's group advantage from its judge) or mix (mix * boss + (1 - mix) * own)."""
    mix: float = 0.5
    """Share of the boss's advantage in mode "mix"."""
    demo_episodes: int = 64
    """Scripted boss episodes (each with its helper episode) for the SFT warm start."""
    epsilon: float = 0.3
    """Probability that the scripted expert answers wrongly (so rewards vary)."""
    sft_steps: int = 100
    """SFT steps on the demonstrations."""
    rl_steps: int = 10
    """GRPO steps."""
    problems: int = 4
    """Numbers (boss env seeds) per GRPO step."""
    group_size: int = 4
    """Boss episodes per number."""
    eval_episodes: int = 32
    """Boss episodes per evaluation."""
    lr: float = 3e-3
    """SFT learning rate (suits the tiny model)."""
    rl_lr: float = 1e-4
    """GRPO learning rate (3e-3 wrecks the warm-started policy in one step). Boss reward after
    10 steps, from -0.09: -0.13 at 1e-4, 0.00 at 3e-4, -0.25 at 1e-3 (parse failures come and
    go); the boss does not learn to copy its number within 10 steps (README)."""
    hidden_size: int = 64
    """Tiny model width."""
    seed: int = 0
    """Seeds the model, data, training and sampling."""
    out_dir: Path = Path("ludic_runs/delegation")
    """Where the data, metrics, rollouts and checkpoints go (refused when it holds an earlier
    run's checkpoints: pass another one for a new run)."""


class SuccessorEnv(SingleAgentEnv):
    """The boss's task: the successor of a number from the env seed; reward 1 if right.

    One answer per episode, as `TaskEnv` takes for the helper: a reply that fails to parse
    ends the episode with the parser's penalty. A second try would give a failed episode two
    turns, so two samples with its negative advantage: each group's boss advantages would sum
    below zero, a net push down on the format every boss reply shares (at --rl-lr 3e-4 the
    boss's answers stopped parsing within 10 steps).
    """

    parse_failure_ends_episode = True

    def __init__(self) -> None:
        self.number = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.number = random.Random(seed).randint(1, 20)
        task = f"Ask the helper for the successor of {self.number}, then reply <move>N</move>."
        return task, {}

    def env_step(self, action: str) -> StepOutcome:
        right = action.strip() == str(self.number + 1)
        return StepOutcome(obs="", reward=1.0 if right else 0.0, terminated=True)


def judge(task: str, answer: str) -> float:
    """The helper's reward: 1 if it gave the successor asked for."""
    found = NUMBER.search(task)
    return 1.0 if found and answer.strip() == str(int(found.group(1)) + 1) else 0.0


def scripted_expert(epsilon: float) -> Any:
    """Plays both roles in text: the boss delegates then repeats the tool result; the helper
    answers. With probability `epsilon` an answer is off by one."""

    def policy(messages: Sequence[Message], rng: random.Random) -> str:
        last = messages[-1]
        text = str(last.get("content") or "")
        wrong = 1 if rng.random() < epsilon else 0
        if last.get("role") == "tool":
            return f"<move>{int(text) + wrong if text.isdigit() else text}</move>"
        found = NUMBER.search(text)
        n = int(found.group(1)) if found else 0
        if text.startswith("Ask the helper"):
            call = {"name": "delegate", "arguments": {"task": f"successor of {n}", "agent": HELPER}}
            # json.dumps' default spacing is how the chat template renders a call back, so the
            # boss's turn stays one append-only sequence (one sample) after the tool result.
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"<move>{n + 1 + wrong}</move>"

    return policy


def rollout_engine(client: ChatClient, *, jsonl_log: Path | None = None) -> RolloutEngine:
    """Boss (ToolAgent with `delegate`) and helper (Agent named "helper") on one client."""
    sampling = SamplingConfig(max_tokens=MAX_TOKENS)

    def helper() -> Agent:
        context = LatestObservationContext()
        return Agent(client, parser=MOVE, sampling=sampling, agent_id=HELPER, context=context)

    def protocol() -> DelegatingProtocol:
        boss = ToolAgent(client, external_tools=[delegate], parser=MOVE, sampling=sampling)
        spec = SubAgentSpec(agent_factory=helper, env_factory=lambda t: TaskEnv(t, judge))
        return DelegatingProtocol(boss, {HELPER: spec}, max_steps=2)

    return RolloutEngine(
        env_registry={"successor": SuccessorEnv},
        protocol_registry={"boss": protocol},
        jsonl_log=jsonl_log,
    )


def requests(n: int, temperature: float = 1.0) -> list[RolloutRequest]:
    sampling = SamplingConfig(temperature=temperature, max_tokens=MAX_TOKENS)
    spec = ComponentSpec(name="successor")
    boss = ComponentSpec(name="boss")
    return [RolloutRequest(env=spec, protocol=boss, sampling=sampling) for _ in range(n)]


def rewards_by_role(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Mean episode reward of the boss and of its helpers, and how often the boss delegated."""
    boss = [r for r in rollouts if "parent_rollout_id" not in r.meta and not r.failed]
    helpers = [r for r in rollouts if r.agent_id == HELPER]
    mean = lambda rs: statistics.mean(r.total_reward for r in rs) if rs else 0.0  # noqa: E731
    delegated = sum(1 for r in boss if r.meta.get("child_rollout_ids"))
    return {
        "boss_reward": mean(boss),
        "helper_reward": mean(helpers),
        "delegation_rate": delegated / len(boss) if boss else 0.0,
    }


async def evaluate(client: ChatClient, cfg: DelegationConfig) -> dict[str, float]:
    """The boss's and helper's rewards on the same `eval_episodes` numbers and sampling seeds
    every time it is called, so before and after RL compare like with like."""
    seeds = SeedSequencer(run_seed=cfg.seed + 1_000)
    rollouts = await rollout_engine(client).run(seeds.seed_requests(requests(cfg.eval_episodes), 0))
    return rewards_by_role(rollouts)


async def warm_start(cfg: DelegationConfig, model: Any, tokenizer: Any) -> int:
    """SFT on the scripted expert's boss and helper turns; returns the policy version."""
    client = PolicyClient(scripted_expert(cfg.epsilon), tokenizer)
    seeds = SeedSequencer(run_seed=cfg.seed)
    demos = await rollout_engine(client).run(seeds.seed_requests(requests(cfg.demo_episodes), 0))
    path = cfg.out_dir / "demos.jsonl"
    with path.open("w", encoding="utf-8") as f:
        write_rollouts_jsonl(demos, f)
    algorithm = make_sft()
    source = OfflineBatchSource(
        paths=path, credit_assigner=algorithm.credit_assigner, batch_size=16, seed=cfg.seed
    )
    out = cfg.out_dir / "sft"
    trainer = make_trainer(model, tokenizer, algorithm, source, out=out, lr=cfg.lr, seed=cfg.seed)
    await trainer.train(cfg.sft_steps, progress=False)
    finish(trainer)
    return trainer.policy_version


async def train(cfg: DelegationConfig) -> dict[str, Any]:
    # Before anything is written: a second run here would overwrite the first one's checkpoints.
    for stage in ("sft", "rl"):
        refuse_earlier_checkpoints(
            cfg.out_dir / stage,
            fix=f"Pass another --out-dir for a new run (or delete {cfg.out_dir}).",
        )
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    spec = TinyModelSpec(hidden_size=cfg.hidden_size, intermediate_size=3 * cfg.hidden_size)
    model, tokenizer = build_tiny_model(seed=cfg.seed, spec=spec)
    version = await warm_start(cfg, model, tokenizer)
    credit = HierarchicalCredit(mode=cfg.mode, mix=cfg.mix)
    algorithm = RLAlgorithm(name="grpo_hierarchical", credit_assigner=credit, loss=make_grpo().loss)
    with EmbeddedEngine(copy.deepcopy(model), tokenizer, policy_version=version) as engine:
        publisher = InProcessPublisher(engine)
        before = await evaluate(engine, cfg)
        log = cfg.out_dir / "rl" / "rollouts.jsonl"
        source = RolloutBatchSource(
            engine=rollout_engine(engine, jsonl_log=log),
            requests_fn=lambda: requests(cfg.problems),
            credit_assigner=credit,
            strategy=GRPORequestStrategy(group_size=cfg.group_size),
            seed_sequencer=SeedSequencer(run_seed=cfg.seed + 1),
        )
        trainer = make_trainer(
            model,
            tokenizer,
            algorithm,
            source,
            out=cfg.out_dir / "rl",
            lr=cfg.rl_lr,
            seed=cfg.seed,
            publisher=publisher,
            initial_policy_version=version,
        )
        history = await trainer.train(cfg.rl_steps, progress=False)
        checkpoint = finish(trainer)
        after = await evaluate(engine, cfg)
    return {
        "before": before,
        "after": after,
        "history": history,
        "rollouts_jsonl": log,
        "model": checkpoint / "model",
    }


def main(cfg: DelegationConfig) -> dict[str, Any]:
    result = asyncio.run(train(cfg))
    for stage in ("before", "after"):
        r = result[stage]
        print(
            f"{stage} RL: boss reward {r['boss_reward']:.2f}, helper reward "
            f"{r['helper_reward']:.2f}, delegated in {r['delegation_rate']:.0%} of episodes"
        )
    print(f"model: {result['model']}")
    print(
        f"browse the episodes with: ludic view {result['rollouts_jsonl']} --tokenizer {result['model']}"
    )
    return result


if __name__ == "__main__":
    main(tyro.cli(DelegationConfig))
