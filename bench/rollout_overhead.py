"""Library overhead per agent step: engine + protocol + agent + credit + sample building.

1,000 ten-step episodes (125 prompts x GRPO groups of 8) against a zero-latency ScriptedClient,
pinned to one CPU core; the median of `--repeats` runs. Prints JSON. Target: >= 5,000 agent
steps/s end to end (< 200 us per step); `library_us_per_step` leaves out the time spent inside
the scripted client (its ChatML rendering stands in for server-side tokenisation).

    python bench/rollout_overhead.py [--episodes 1000] [--steps 10] [--repeats 3] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import sys
import time
from collections.abc import Sequence

from _args import positive_int, show_defaults
from _machine import measured_on

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import (
    ComponentSpec,
    CreditAssigner,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
    build_samples,
    generate_batch,
)
from ludic.types import Info, Rollout, StepOutcome

GROUP_SIZE = 8


class TenStepEnv(SingleAgentEnv):
    """Reward 1 per "ok" action; terminates after `length` steps. Observations stay short."""

    inline_sync_calls = True  # pure and fast, as the built-in games (bench/off_loop_overhead.py)

    def __init__(self, length: int = 10) -> None:
        self.length = length
        self.t = 0

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.t = 0
        return f"task {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        self.t += 1
        done = self.t >= self.length
        return StepOutcome(obs=f"obs {self.t}", reward=float(action == "ok"), terminated=done)


class TimedClient:
    """A ScriptedClient that adds the seconds spent inside `complete` to `spent[0]` (the
    stand-in for a server's tokenisation: not library overhead)."""

    def __init__(self, spent: list[float]) -> None:
        self.inner = ScriptedClient(["ok"])
        self.spent = spent

    async def complete(self, request: ChatRequest) -> ChatResponse:
        t0 = time.perf_counter()
        response = await self.inner.complete(request)
        self.spent[0] += time.perf_counter() - t0
        return response


class _ConstantCredit:
    """Fallback when the training credit assigners are not importable: weight 1 per turn."""

    def assign(self, rollouts: Sequence[Rollout]) -> dict[tuple[str, str], float]:
        return {(r.id, t.turn_id): 1.0 for r in rollouts for t in r.turns()}


def credit_assigner() -> tuple[CreditAssigner, str]:
    try:
        from ludic.training.credit import GroupNormalizedReturn
    except ImportError:
        return _ConstantCredit(), "constant (fallback)"
    return GroupNormalizedReturn(), "GroupNormalizedReturn"


def make_engine(steps: int, client_s: list[float]) -> RolloutEngine:
    return RolloutEngine(
        env_registry={"ten": lambda: TenStepEnv(steps)},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(TimedClient(client_s)), max_steps=steps)
        },
        concurrency=64,
    )


def make_requests(episodes: int) -> list[RolloutRequest]:
    logical = [
        RolloutRequest(
            env=ComponentSpec(name="ten"), protocol=ComponentSpec(name="single"), request_id=f"q{i}"
        )
        for i in range(episodes // GROUP_SIZE)
    ]
    return SeedSequencer(run_seed=0).seed_requests(logical, batch_index=0)


async def timed_batch(
    episodes: int, steps: int, credit: CreditAssigner
) -> tuple[float, float, int, int, int]:
    """One end-to-end `generate_batch`: (seconds, client seconds, steps, samples, failed)."""
    client_s = [0.0]
    engine = make_engine(steps, client_s)
    requests = make_requests(episodes)
    gc.collect()
    t0 = time.perf_counter()
    result = await generate_batch(
        engine, requests, credit, strategy=GRPORequestStrategy(group_size=GROUP_SIZE)
    )
    total_s = time.perf_counter() - t0
    stats = result.stats
    return total_s, client_s[0], stats.num_agent_steps, stats.num_samples, stats.num_failed


async def stage_breakdown(episodes: int, steps: int, credit: CreditAssigner) -> dict[str, float]:
    """Microseconds per agent step in each stage (client time counts in the engine stage)."""
    engine = make_engine(steps, [0.0])
    requests = GRPORequestStrategy(group_size=GROUP_SIZE).expand(make_requests(episodes))
    t0 = time.perf_counter()
    rollouts = await engine.run(requests)
    t1 = time.perf_counter()
    weights = credit.assign(rollouts)
    t2 = time.perf_counter()
    build_samples(rollouts, weights)
    t3 = time.perf_counter()
    n = sum(len(r.agent_steps) for r in rollouts)
    return {
        "engine_protocol_agent_client": round(1e6 * (t1 - t0) / n, 2),
        "credit": round(1e6 * (t2 - t1) / n, 2),
        "build_samples": round(1e6 * (t3 - t2) / n, 2),
    }


async def measure(episodes: int, steps: int, repeats: int) -> dict[str, object]:
    credit, credit_name = credit_assigner()
    await timed_batch(GROUP_SIZE, steps, credit)  # warm-up
    runs = [await timed_batch(episodes, steps, credit) for _ in range(repeats)]
    runs.sort(key=lambda run: run[0])
    median, best = runs[len(runs) // 2], runs[0]
    total_s, client_s, agent_steps, samples, failed = median
    library_us = 1e6 * (total_s - client_s) / agent_steps
    return {
        "episodes": episodes,
        "steps_per_episode": steps,
        "agent_steps": agent_steps,
        "samples": samples,
        "failed": failed,
        "credit_assigner": credit_name,
        "repeats": repeats,
        "median_total_s": round(total_s, 4),
        "agent_steps_per_s": round(agent_steps / total_s, 1),
        "best_agent_steps_per_s": round(best[2] / best[0], 1),
        "us_per_step": round(1e6 * total_s / agent_steps, 2),
        "client_us_per_step": round(1e6 * client_s / agent_steps, 2),
        "library_us_per_step": round(library_us, 2),
        "stage_us_per_step": await stage_breakdown(episodes, steps, credit),
        "target_steps_per_s": 5000,
        "meets_target": agent_steps / total_s >= 5000,
        "library_meets_target": library_us <= 200,
    }


def episodes_arg(text: str) -> int:
    """An argparse type: a positive multiple of GROUP_SIZE (whole groups are what runs)."""
    value = int(text)
    if value < GROUP_SIZE or value % GROUP_SIZE:
        raise argparse.ArgumentTypeError(
            f"must be a positive multiple of the group size {GROUP_SIZE}, got {value}"
        )
    return value


def add_size_args(parser: argparse.ArgumentParser) -> None:
    """--episodes, --steps and --repeats, as both overhead benches take them."""
    parser.add_argument(
        "--episodes", type=episodes_arg, default=1000, help=f"a multiple of {GROUP_SIZE}"
    )
    parser.add_argument("--steps", type=positive_int, default=10)
    parser.add_argument("--repeats", type=positive_int, default=3, help="report the median run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_args(parser)
    parser.add_argument("--profile", action="store_true", help="print a cProfile to stderr")
    args = show_defaults(parser).parse_args()
    load_before = os.getloadavg()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
    report = asyncio.run(measure(args.episodes, args.steps, args.repeats))
    if args.profile:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    report["python"] = sys.version.split()[0]
    report["measured_on"] = measured_on(load_before)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
