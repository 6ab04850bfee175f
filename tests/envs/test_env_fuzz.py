"""Fuzz (hypothesis): random and malformed action strings never make a built-in env raise;
outcomes stay well-formed and JSON-safe, and the same seed and actions replay identically."""

from __future__ import annotations

import asyncio
import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ludic._aio import maybe_await
from ludic.envs import BUILTIN_ENVS, LudicEnv
from ludic.types import StepOutcome

TRICKY = [
    "1", "5", "9", "0", "10", "-1", " 3 ", "3\n", "٣", "５", "1e3", "5.0", "up", "UP", "pickup",
    "left", "right", "down", "next", "back", "answer 7", "42", "$1,000", "\\boxed{4}",
    "<move>5</move>", "", " ", "\x00", "\u202e5", "9" * 5000, "🙂",
]  # fmt: skip
ACTIONS = st.lists(st.one_of(st.text(max_size=40), st.sampled_from(TRICKY)), max_size=14)
SEEDS = st.integers(min_value=-(2**40), max_value=2**40)


async def drive(env: LudicEnv, seed: int, actions: list[str]) -> list[tuple[str, StepOutcome]]:
    """Play `actions` through the public `reset`/`step` (resetting after each episode end)."""
    trace: list[tuple[str, StepOutcome]] = []
    await maybe_await(env.reset(seed=seed))
    for action in actions:
        outcomes = await maybe_await(env.step({aid: action for aid in env.active_agents}))
        trace.extend(sorted(outcomes.items()))
        if any(o.terminated for o in outcomes.values()):
            await maybe_await(env.reset(seed=seed))
    return trace


# The code env runs every action in a sandbox (slow, and timings in its info differ run to
# run); tests/envs/test_code_env.py and tests/sandbox cover it.
FUZZED = sorted(name for name in BUILTIN_ENVS if name != "code")


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(FUZZED), seed=SEEDS, actions=ACTIONS)
def test_no_action_string_makes_an_env_raise(name: str, seed: int, actions: list[str]) -> None:
    kwargs = {"filler_words": 3} if name == "memory_corridor" else {}
    trace = asyncio.run(drive(BUILTIN_ENVS[name](**kwargs), seed, actions))
    for _, outcome in trace:
        assert isinstance(outcome.obs, str) and math.isfinite(outcome.reward)
        json.dumps(outcome.info)
    assert asyncio.run(drive(BUILTIN_ENVS[name](**kwargs), seed, actions)) == trace
