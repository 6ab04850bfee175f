"""The README's vLLM section serves `ludic actor --env tictactoe` with `--max-model-len N`: the
prompts that command sends under its defaults (the env's system prompt and parser, the full
board, the latest-observation context, `--max-tokens` as `ActorConfig` has it), measured with
the tokenizer of the model the vLLM tests serve, plus `--max-tokens`, must fit in N with room
to spare (vLLM answers a prompt plus `max_tokens` over `--max-model-len` with a 400, and the
episode fails), and the token counts the README quotes must be the measured ones. vLLM itself
is not run: the limit it applies is this arithmetic."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import re
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from ludic.agents.base import Agent
from ludic.context.latest_observation import LatestObservationContext
from ludic.eval.env_spec import resolve_env_factory, resolve_parser
from ludic.inference.embedded.prompts import render_prompt_ids
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import ScriptedClient
from ludic.interaction.single_agent import SingleAgentProtocol
from ludic.models import load_tiny_model
from ludic.pipeline.config import ActorConfig
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.types import Message

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Inference: embedded engine, HTTP server, vLLM"
MARGIN = 1.5
"""How much longer than the longest measured prompt plus --max-tokens the documented context
must be: a model's replies re-tokenize to other lengths than these seeded ones."""
GARBAGE_SEEDS = range(16)


def vllm_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def documented_max_model_len(section: str) -> int:
    """The --max-model-len of the section's one bash block that starts the vLLM server."""
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    lens = [
        int(m)
        for block in blocks
        if "ludic.inference.vllm.server" in block
        for m in re.findall(r"--max-model-len[ =](\d+)", block)
    ]
    assert len(lens) == 1, f"expected one vLLM command with --max-model-len, found {lens}"
    return lens[0]


def vllm_test_spec() -> Any:
    """`SPEC` of tests/inference/test_vllm_cpu.py, the model the README's vLLM runs serve."""
    path = ROOT / "tests" / "inference" / "test_vllm_cpu.py"
    spec = importlib.util.spec_from_file_location("_readme_vllm_cpu_spec", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SPEC


def actor_default(name: str) -> Any:
    return next(f.default for f in fields(ActorConfig) if f.name == name)


def garbage(tokenizer: Any, n_tokens: int, seed: int) -> str:
    """What an untrained model writes in `n_tokens` tokens: seeded random ordinary ids."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    return str(tokenizer.decode([rng.choice(ids) for _ in range(n_tokens)]))


def legal_move(messages: Sequence[Message]) -> str:
    moves = re.findall(r"Legal moves: ([\d, ]+)\.", str(messages[-1]["content"]))
    return f"<move>{moves[-1].split(',')[0].strip()}</move>"


def prompt_lengths(tokenizer: Any, mark: str, reply: str, max_tokens: int) -> list[int]:
    """Token counts of the prompts of one tictactoe episode as `ludic actor` plays it, the
    agent's replies alternating `reply` (unparsed: the next prompt shows it and the feedback)
    and a legal move."""

    def replies(messages: Sequence[Message]) -> str:
        asked = sum(m["role"] == "assistant" for m in messages)  # 0, then 1 after a failure
        return reply if asked == 0 else legal_move(messages)

    client = ScriptedClient(replies)
    factory = resolve_env_factory("tictactoe")
    parser = resolve_parser(actor_default("parser"), factory, {})
    assert actor_default("system_prompt") is None  # the env's own, as below

    def protocol() -> SingleAgentProtocol:
        agent = Agent(client, context=LatestObservationContext(), parser=parser)
        return SingleAgentProtocol(agent, max_steps=actor_default("max_steps"))

    engine = RolloutEngine(
        env_registry={"tictactoe": factory}, protocol_registry={"single": protocol}
    )
    request = RolloutRequest(
        env=ComponentSpec(name="tictactoe", kwargs={"agent_mark": mark}),
        protocol=ComponentSpec(name="single"),
        sampling=SamplingConfig(max_tokens=max_tokens),
    )
    (rollout,) = asyncio.run(engine.run([request]))
    assert not rollout.failed, rollout.meta
    return [len(render_prompt_ids(tokenizer, r.messages)) for r in client.requests]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tiny_model(seed=0, spec=vllm_test_spec())[1]


def test_tictactoe_prompts_fit_the_documented_vllm_context(tokenizer: Any) -> None:
    assert actor_default("context") == "auto"  # tictactoe's suggestion: the latest observation
    max_tokens = actor_default("max_tokens")
    max_model_len = documented_max_model_len(vllm_section())
    longest = max(
        n
        for mark in ("X", "O")
        for seed in GARBAGE_SEEDS
        for n in prompt_lengths(tokenizer, mark, garbage(tokenizer, max_tokens, seed), max_tokens)
    )
    needed = longest + max_tokens
    assert needed * MARGIN <= max_model_len, (
        f"the longest tictactoe prompt is {longest} tokens; with --max-tokens {max_tokens} a "
        f"request needs {needed}, and the README's vLLM --max-model-len {max_model_len} leaves "
        f"less than {MARGIN}x that"
    )
    assert needed > 512, (
        f"{needed} tokens fit the vLLM tests' --max-model-len 512: the README says they do not "
        '(update its "Context length for tictactoe")'
    )


def test_the_token_counts_the_readme_quotes_are_measured(tokenizer: Any) -> None:
    section = " ".join(vllm_section().split())  # as read, whatever the line breaks
    max_tokens = actor_default("max_tokens")
    first = prompt_lengths(tokenizer, "X", "<move>5</move>", max_tokens)[0]
    first_as_o = prompt_lengths(tokenizer, "O", "<move>5</move>", max_tokens)[0]
    assert f"first prompt is {first} tokens ({first_as_o} playing O)" in section, (
        first,
        first_as_o,
    )
    assert f"--max-tokens {max_tokens}" in section, max_tokens
