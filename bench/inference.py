"""Benchmark: embedded engine throughput vs `model.generate`, on the tiny local model.

Prints JSON: new tokens/s of the EmbeddedEngine with 1, 8 and 32 concurrent agents, against
sequential `model.generate` calls and against batched (left-padded) `model.generate` calls on
the same model and the same workload. Workloads:

- `single_turn`: each agent sends one chat request; the batched baseline is exactly one call.
- `agent_episodes`: each agent plays 3 turns, token-in: turn t+1's prompt is turn t's prompt +
  its completion + the next user message, sent only after turn t returns. The batched baseline
  makes one call per turn across agents (a barrier per turn).
- `single_turn_distinct_prompts` (32 agents): as `single_turn`, every prompt different.

Agents play one board, so first prompts come in 3 shapes (different lengths); the engine
prefills identical prompts admitted together once (as for a GRPO group), `generate` cannot.
Requests have different prompt lengths and token budgets. A batched `generate` call runs every
row to the largest budget in the call, so there only each row's tokens within its own budget
(and up to eos) count as new tokens. Everything samples at temperature 1. Each cell is the best
of `--repeats` interleaved runs (default 3), by wall time and by process CPU time: this machine's
speed drifts by 10% between runs, and the best run is the one least disturbed; the ratio within
each round is reported too (`round_speedups_*`), so the spread is visible. CPU-time ratios
understate the engine (it keeps both cores busy; batch-1 `generate` does not), `--threads 1`
keeps them comparable between arms.
`--batch-invariant` runs the engine with `EngineConfig(batch_invariant=True)` (each seeded
request's tokens and logprobs independent of the batch; prefix reuse off), to measure its cost.
`--compare-invariant` instead runs the default and the batch-invariant engine on the same
workloads, interleaved and order-swapped round by round, and reports invariant / default
tokens per wall and per CPU second (`invariant_vs_default`).
Run: `python bench/inference.py [--threads N] [--repeats N] [--batch-invariant |
--compare-invariant]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from _args import positive_int, show_defaults
from _machine import measured_on
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ludic.inference.client import ChatRequest
from ludic.inference.embedded.engine import EmbeddedEngine, EngineConfig
from ludic.inference.embedded.prompts import render_prompt_ids
from ludic.inference.sampling import SamplingConfig
from ludic.models import load_tiny_model

BOARD = "1 | X | 3\nO | 5 | 6\n7 | 8 | X"
SINGLE_TURN_BUDGETS = (64, 192)
EPISODE_BUDGETS = (32, 128)
TURNS = 3
REPEATS = 3


@dataclass(frozen=True)
class Agent:
    """One agent's first prompt and its per-turn token budgets."""

    prompt_ids: list[int]
    budgets: list[int]
    seed: int


def make_agents(
    n: int,
    turns: int,
    tokenizer: PreTrainedTokenizerBase,
    budgets: tuple[int, int],
    distinct: bool = False,
) -> list[Agent]:
    """Agents on one board: 3 prompt shapes (the engine prefills identical prompts once), or
    every prompt different (`distinct`: each names its agent)."""
    low, high = budgets
    agents = []
    for i in range(n):
        name = f"You are agent {i}. " if distinct else ""
        history = [{"role": "user", "content": f"{name}Board:\n{BOARD}\nYour move."}]
        for _ in range(i % 3):  # prompts of different lengths
            history += [
                {"role": "assistant", "content": "<think>Corner.</think><move>1</move>"},
                {"role": "user", "content": f"Invalid move. Board:\n{BOARD}\nTry again."},
            ]
        agent_budgets = [low + (i * 37 + t * 53) % (high - low + 1) for t in range(turns)]
        agents.append(Agent(render_prompt_ids(tokenizer, history), agent_budgets, seed=i))
    return agents


def follow_up_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    text = f"\n<|im_start|>user\nBoard:\n{BOARD}\nYour move.<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(text, add_special_tokens=False))


def _count_new(row: list[int], budget: int, eos: set[int]) -> int:
    for i, t in enumerate(row[:budget]):
        if t in eos:
            return i + 1
    return min(len(row), budget)


def run_engine(
    engine: EmbeddedEngine, agents: list[Agent], follow_up: list[int]
) -> tuple[int, float]:
    async def episode(agent: Agent) -> int:
        prompt, total = agent.prompt_ids, 0
        for turn, budget in enumerate(agent.budgets):
            sampling = SamplingConfig(max_tokens=budget, seed=agent.seed * 100 + turn)
            r = await engine.complete(
                ChatRequest(messages=[], prompt_token_ids=prompt, sampling=sampling)
            )
            total += len(r.completion_token_ids)
            prompt = [*prompt, *r.completion_token_ids, *follow_up]
        return total

    async def go() -> list[int]:
        return await asyncio.gather(*(episode(a) for a in agents))

    clock = Clock()
    counts = asyncio.run(go())
    return sum(counts), clock.elapsed()


def _generate(
    model: PreTrainedModel, prompts: list[list[int]], budgets: list[int], pad: int
) -> list[list[int]]:
    longest = max(map(len, prompts))
    ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max(budgets),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        pad_token_id=pad,
    )
    return [row[:b] for row, b in zip(out[:, longest:].tolist(), budgets, strict=True)]


@torch.inference_mode()
def run_generate(
    model: PreTrainedModel,
    agents: list[Agent],
    follow_up: list[int],
    pad: int,
    eos: set[int],
    batched: bool,
) -> tuple[int, float]:
    """Sequential: one generate call per request. Batched: one call per turn across agents."""
    prompts = [a.prompt_ids for a in agents]
    total, clock = 0, Clock()
    for turn in range(len(agents[0].budgets)):
        budgets = [a.budgets[turn] for a in agents]
        if batched:
            outputs = _generate(model, prompts, budgets, pad)
        else:
            outputs = [
                _generate(model, [p], [b], pad)[0] for p, b in zip(prompts, budgets, strict=True)
            ]
        completions = [
            row[: _count_new(row, b, eos)] for row, b in zip(outputs, budgets, strict=True)
        ]
        total += sum(map(len, completions))
        prompts = [[*p, *c, *follow_up] for p, c in zip(prompts, completions, strict=True)]
    return total, clock.elapsed()


class Clock:
    """Wall and process-CPU seconds since creation (CPU time is what a busy, shared machine
    does not inflate: a run that waits for the CPU is not charged for it)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def elapsed(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


Run = Callable[[], tuple[int, tuple[float, float]]]


def measure(
    engine: EmbeddedEngine,
    n: int,
    turns: int,
    budgets: tuple[int, int],
    distinct: bool = False,
    repeats: int = REPEATS,
) -> dict[str, float | int]:
    """Best tokens per wall second and per CPU second of each arm, arms interleaved."""
    model, tokenizer = engine.model, engine.tokenizer
    eos, pad = set(engine.eos_ids), int(tokenizer.pad_token_id)
    agents = make_agents(n, turns, tokenizer, budgets, distinct)
    follow_up = follow_up_ids(tokenizer)
    arms: dict[str, Run] = {
        "engine": lambda: run_engine(engine, agents, follow_up),
        "sequential_generate": lambda: run_generate(
            model, agents, follow_up, pad, eos, batched=False
        ),
        "batched_generate": lambda: run_generate(model, agents, follow_up, pad, eos, batched=True),
    }
    wall = dict.fromkeys(arms, 0.0)
    cpu = dict.fromkeys(arms, 0.0)
    rounds: list[dict[str, float]] = []  # tokens per wall second of each arm, per round
    for _ in range(repeats):
        rounds.append({})
        for name, run in arms.items():
            tokens, (wall_s, cpu_s) = run()
            rounds[-1][name] = tokens / wall_s
            wall[name] = max(wall[name], tokens / wall_s)
            cpu[name] = max(cpu[name], tokens / cpu_s)
    row: dict[str, float | int] = {
        "concurrency": n,
        "requests": n * turns,
        "distinct_first_prompts": len({tuple(a.prompt_ids) for a in agents}),
    }
    for name in arms:
        row[f"{name}_tokens_per_s"] = round(wall[name], 1)
    for baseline in ("sequential_generate", "batched_generate"):
        short = baseline.split("_")[0]
        row[f"speedup_vs_{short}"] = round(wall["engine"] / wall[baseline], 2)
        row[f"cpu_speedup_vs_{short}"] = round(cpu["engine"] / cpu[baseline], 2)
        per_round = sorted(r["engine"] / r[baseline] for r in rounds)
        row[f"round_speedups_vs_{short}"] = [round(x, 2) for x in per_round]
    return row


def compare_invariant(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, repeats: int
) -> dict[str, object]:
    """Invariant / default engine throughput per workload, arms interleaved and order-swapped."""
    engines = {
        "default": EmbeddedEngine(model, tokenizer),
        "invariant": EmbeddedEngine(model, tokenizer, config=EngineConfig(batch_invariant=True)),
    }
    follow_up = follow_up_ids(tokenizer)
    cells = {
        "single_turn_32": (32, 1, SINGLE_TURN_BUDGETS),
        "agent_episodes_8": (8, TURNS, EPISODE_BUDGETS),
        "agent_episodes_32": (32, TURNS, EPISODE_BUDGETS),
        "single_turn_1": (1, 1, SINGLE_TURN_BUDGETS),
    }
    out: dict[str, object] = {}
    for cell, (n, turns, budgets) in cells.items():
        agents = make_agents(n, turns, tokenizer, budgets)
        for engine in engines.values():
            run_engine(engine, agents, follow_up)  # warm up
        wall = {name: 0.0 for name in engines}
        cpu = {name: 0.0 for name in engines}
        for round_ in range(repeats):
            order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
            for name in order:
                tokens, (wall_s, cpu_s) = run_engine(engines[name], agents, follow_up)
                wall[name] = max(wall[name], tokens / wall_s)
                cpu[name] = max(cpu[name], tokens / cpu_s)
        out[cell] = {
            "default_tokens_per_cpu_s": round(cpu["default"], 1),
            "invariant_tokens_per_cpu_s": round(cpu["invariant"], 1),
            "invariant_vs_default_cpu": round(cpu["invariant"] / cpu["default"], 2),
            "invariant_vs_default_wall": round(wall["invariant"] / wall["default"], 2),
        }
    for engine in engines.values():
        engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch intra-op threads (default: torch's own count, as the report names it)",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=REPEATS, help="runs per cell (best kept)"
    )
    parser.add_argument(
        "--batch-invariant", action="store_true", help="EngineConfig(batch_invariant=True)"
    )
    parser.add_argument(
        "--compare-invariant",
        action="store_true",
        help="default vs batch-invariant engine, interleaved (invariant_vs_default)",
    )
    args = show_defaults(parser).parse_args()
    load_before = os.getloadavg()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = load_tiny_model()
    if args.compare_invariant:
        report = {
            "benchmark": "inference_invariant_vs_default",
            "torch_threads": torch.get_num_threads(),
            "timing": f"best of {args.repeats} interleaved, order-swapped runs per arm",
            "load_avg": os.getloadavg(),
            "cells": compare_invariant(model, tokenizer, args.repeats),
        }
        print(json.dumps({**report, "measured_on": measured_on(load_before)}, indent=2))
        return
    engine = EmbeddedEngine(
        model, tokenizer, config=EngineConfig(batch_invariant=args.batch_invariant)
    )
    run_engine(engine, make_agents(4, 1, tokenizer, SINGLE_TURN_BUDGETS), [])  # warm up
    r = args.repeats
    workloads = {
        "single_turn": [measure(engine, n, 1, SINGLE_TURN_BUDGETS, repeats=r) for n in (1, 8, 32)],
        "agent_episodes": [
            measure(engine, n, TURNS, EPISODE_BUDGETS, repeats=r) for n in (1, 8, 32)
        ],
        "single_turn_distinct_prompts": [
            measure(engine, 32, 1, SINGLE_TURN_BUDGETS, distinct=True, repeats=r)
        ],
    }
    engine.close()
    params = sum(p.numel() for p in model.parameters())
    report = {
        "benchmark": "inference",
        "model": f"tiny llama, {params} params, fp32, {model.device}",
        "torch_threads": torch.get_num_threads(),
        "batch_invariant": args.batch_invariant,
        "machine": platform.machine(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "targets_at_32": {"vs_sequential": 10.0, "vs_batched": 1.3},
        "token_budgets": {"single_turn": SINGLE_TURN_BUDGETS, "agent_episodes": EPISODE_BUDGETS},
        "timing": f"best of {r} interleaved runs per cell; speedup_* from wall time, "
        "cpu_speedup_* from process CPU time (robust to other load on the machine), "
        "round_speedups_* the wall-time ratio within each round of back-to-back runs, sorted "
        "(their spread shows the machine's noise)",
        "workloads": workloads,
        "measured_on": measured_on(load_before),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
