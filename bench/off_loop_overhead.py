"""What running env calls and parsers off the event loop costs, end to end.

Runs `rollout_overhead.py`'s batch (1,000 ten-step episodes, zero-latency client, one CPU core)
four ways: env calls inline or on worker threads (`LudicEnv.inline_sync_calls`), parsing
inline or on worker threads (`Agent.parse_inline_max_chars = 0`). Prints JSON: agent steps/s
and microseconds per step for each, and the per-step cost of each thread hop. A real model
call takes milliseconds, so the hop matters only for CPU-bound loops like this one; the
defaults (threads for user envs, inline for the built-in games and for replies up to 1,024
chars) keep a blocking env or a slow parser under the episode timeout.

    python bench/off_loop_overhead.py [--episodes 1000] [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from _args import show_defaults
from _machine import measured_on
from rollout_overhead import TenStepEnv, add_size_args, credit_assigner, timed_batch

from ludic.agents import Agent


async def steps_per_s(episodes: int, steps: int, repeats: int) -> float:
    credit, _ = credit_assigner()
    await timed_batch(8, steps, credit)  # warm-up (threads, caches)
    runs = sorted(
        agent_steps / total_s
        for total_s, _, agent_steps, _, _ in [
            await timed_batch(episodes, steps, credit) for _ in range(repeats)
        ]
    )
    return runs[len(runs) // 2]


async def measure(episodes: int, steps: int, repeats: int) -> dict[str, object]:
    report: dict[str, object] = {"episodes": episodes, "steps_per_episode": steps}
    rates: dict[str, float] = {}
    for env_mode, inline_env in (("env_inline", True), ("env_thread", False)):
        for parse_mode, max_chars in (("parse_inline", 1024), ("parse_thread", 0)):
            TenStepEnv.inline_sync_calls = inline_env
            Agent.parse_inline_max_chars = max_chars
            rates[f"{env_mode}+{parse_mode}"] = await steps_per_s(episodes, steps, repeats)
    base = 1e6 / rates["env_inline+parse_inline"]
    report["agent_steps_per_s"] = {k: round(v, 1) for k, v in rates.items()}
    report["us_per_step"] = {k: round(1e6 / v, 1) for k, v in rates.items()}
    report["env_thread_hop_us_per_step"] = round(1e6 / rates["env_thread+parse_inline"] - base, 1)
    report["parse_thread_hop_us_per_step"] = round(1e6 / rates["env_inline+parse_thread"] - base, 1)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_args(parser)
    args = show_defaults(parser).parse_args()
    load_before = os.getloadavg()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    report = asyncio.run(measure(args.episodes, args.steps, args.repeats))
    report["python"] = sys.version.split()[0]
    report["measured_on"] = measured_on(load_before)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
