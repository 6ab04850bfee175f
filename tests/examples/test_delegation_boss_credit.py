"""The delegation example's boss takes one answer per episode: a reply that fails to parse ends
its episode (penalty -1, once) instead of asking again. With a second try, a failed episode had
two turns, so two samples carried its negative advantage and every group's boss advantages
summed below zero: a net push down on the format tokens all boss replies share. At --rl-lr 3e-4
the boss's answers then stopped parsing within 10 steps (parse errors 12% -> 59% of samples,
boss reward -0.28 -> -1.47); with one answer per episode, parse errors stay at 0-22% and the
boss goes -0.09 -> 0.00 (2-core Xeon VM, seed 0, 2026-11-28)."""

from __future__ import annotations

import asyncio
import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from test_examples import load_example

from ludic.models import TinyModelSpec, build_tiny_model
from ludic.recipes.expert import PolicyClient
from ludic.rollouts import BatchResult, GRPORequestStrategy, SeedSequencer, generate_batch
from ludic.training import HierarchicalCredit
from ludic.types import Message


def garbling(expert: Callable[..., str]) -> Callable[[Sequence[Message], random.Random], str]:
    """The scripted expert, whose boss answers `<move>` (no number: a parse failure) to 40% of
    the tool results it reads."""

    def policy(messages: Sequence[Message], rng: random.Random) -> str:
        if messages[-1].get("role") == "tool" and rng.random() < 0.4:
            return "<move>"
        return expert(messages, rng)

    return policy


def boss_batch(example: Any) -> BatchResult:
    _, tokenizer = build_tiny_model(seed=0, spec=TinyModelSpec(hidden_size=32))
    client = PolicyClient(garbling(example.scripted_expert(0.3)), tokenizer)
    requests = SeedSequencer(run_seed=0).seed_requests(example.requests(4), 0)
    return asyncio.run(
        generate_batch(
            example.rollout_engine(client),
            requests,
            HierarchicalCredit(mode="mix"),
            strategy=GRPORequestStrategy(group_size=4),
        )
    )


def test_the_boss_gets_one_sample_per_episode_and_no_net_push() -> None:
    batch = boss_batch(load_example("delegation/train.py"))
    bosses = [r for r in batch.rollouts if "parent_rollout_id" not in r.meta]
    assert len(bosses) == 16 and not any(r.failed for r in bosses)
    failed = [r for r in bosses if any(s.info.get("parse_error") for s in r.agent_steps)]
    assert failed  # the case this test is about happened
    samples = [s for s in batch.samples if s.meta["agent_id"] == "agent_0"]
    by_group: defaultdict[str, list[float]] = defaultdict(list)
    for sample in samples:
        by_group[sample.meta["group_id"]].append(sample.weight)
    assert any(w != 0.0 for w in (s.weight for s in samples))  # a learning signal
    for weights in by_group.values():  # GRPO advantages: zero-sum within each group
        assert math.isclose(math.fsum(weights), 0.0, abs_tol=1e-9)
    assert len(samples) == len(bosses)  # one turn, one sample per boss episode
    assert all(r.meta["termination_reason"] == "parse_error" for r in failed)
    assert all(r.total_reward == -1.0 for r in failed)  # the penalty, once
