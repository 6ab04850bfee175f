"""Shared by the tests that replay a quickstart checkpoint's evaluation (`ludic eval`, the
tic-tac-toe eval example): a budget small enough for a test (~30 s) yet large enough that the
model plays (after RL it wins some games and makes some illegal moves, so the numbers compared
are not all 0% or 100% and the rule for an illegal move changes the games), and the games of a
rollouts JSONL, per opponent seed, to compare prompt for prompt and token for token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BUDGET: dict[str, Any] = {
    "expert_episodes": 64,
    "sft_steps": 120,
    "sft_batch_size": 32,
    "rl_steps": 2,
    "rl_groups": 2,
    "group_size": 2,
    "eval_episodes": 8,
    "hidden_size": 64,
}


def games(rollouts_jsonl: Path) -> dict[int, list[tuple[Any, ...]]]:
    """Per opponent seed: every model call's prompt, reply, tokens and logprobs."""
    by_seed = {}
    for line in rollouts_jsonl.read_text().splitlines():
        rollout = json.loads(line)
        calls = [s for s in rollout["steps"] if s.get("kind", "agent") == "agent"]
        by_seed[rollout["meta"]["env_seed"]] = [
            (
                json.dumps(s["prompt_messages"]),
                s["completion"],
                tuple(s["trace"]["completion_token_ids"]),
                tuple(s["trace"]["completion_logprobs"]),
            )
            for s in calls
        ]
    return by_seed
