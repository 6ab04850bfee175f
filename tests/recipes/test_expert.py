"""PolicyClient: scripted replies whose token traces are exactly the model's own tokenisation."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from ludic.inference import ChatRequest, SamplingConfig
from ludic.inference.embedded.prompts import render_prompt_ids
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.recipes.expert import PolicyClient
from ludic.rollouts import build_samples
from ludic.training import ConstantCredit
from ludic.types import Message

SPEC = TinyModelSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
MESSAGES = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Your move."}]


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return build_tiny_model(spec=SPEC)[1]


def random_cell(messages: Sequence[Message], rng: random.Random) -> str:
    return f"<move>{rng.randint(1, 9)}</move>"


def test_trace_is_the_chat_template_and_the_reply_tokens(tokenizer) -> None:  # type: ignore[no-untyped-def]
    client = PolicyClient(lambda messages, rng: "<move>5</move>", tokenizer)
    response = asyncio.run(client.complete(ChatRequest(messages=MESSAGES)))
    assert list(response.prompt_token_ids) == render_prompt_ids(tokenizer, MESSAGES)
    reply_ids = tokenizer.encode("<move>5</move>", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert list(response.completion_token_ids) == [*reply_ids, im_end]
    assert response.finish_reason == "stop" and response.completion_logprobs is None
    # prompt + completion is what the template renders for the whole exchange
    full = tokenizer.apply_chat_template(
        [*MESSAGES, {"role": "assistant", "content": "<move>5</move>"}], tokenize=False
    )
    ids = tokenizer.encode(full, add_special_tokens=False)
    assert ids[: len(response.prompt_token_ids) + len(reply_ids) + 1] == [
        *response.prompt_token_ids,
        *response.completion_token_ids,
    ]


def test_replies_are_seeded_by_the_request(tokenizer) -> None:  # type: ignore[no-untyped-def]
    client = PolicyClient(random_cell, tokenizer)

    def reply(seed: int | None) -> str:
        request = ChatRequest(messages=MESSAGES, sampling=SamplingConfig(seed=seed))
        return asyncio.run(client.complete(request)).text

    assert [reply(7) for _ in range(3)] == [reply(7)] * 3
    assert len({reply(s) for s in range(30)}) > 1
    assert client.calls == 3 + 1 + 30


def test_token_in_requests_keep_their_prompt_ids(tokenizer) -> None:  # type: ignore[no-untyped-def]
    client = PolicyClient(random_cell, tokenizer)
    request = ChatRequest(messages=MESSAGES, prompt_token_ids=[1, 2, 3])
    assert asyncio.run(client.complete(request)).prompt_token_ids == (1, 2, 3)


def test_rollouts_from_the_client_train_on_exactly_the_reply(tokenizer) -> None:  # type: ignore[no-untyped-def]
    from ludic.agents import Agent
    from ludic.envs import TicTacToeEnv
    from ludic.interaction import SingleAgentProtocol
    from ludic.parsers import xml_tag_parser
    from ludic.recipes.tictactoe import expert_policy

    agent = Agent(PolicyClient(expert_policy(0.0), tokenizer), parser=xml_tag_parser("move"))
    (rollout,) = asyncio.run(SingleAgentProtocol(agent).run(TicTacToeEnv(), env_seed=0))
    samples = build_samples([rollout], ConstantCredit(value=1.0).assign([rollout]))
    assert len(samples) == len(rollout.agent_steps) >= 3
    for sample, step in zip(samples, rollout.agent_steps, strict=True):
        actions = [t for t, m in zip(sample.input_ids, sample.action_mask, strict=True) if m]
        assert tokenizer.decode(actions) == step.completion + "<|im_end|>"


def test_a_tokenizer_without_eos_needs_an_explicit_end_token(tokenizer) -> None:  # type: ignore[no-untyped-def]
    class NoEos:
        eos_token = None

        def convert_tokens_to_ids(self, token: str) -> None:
            return None

    with pytest.raises(ValueError, match="end-of-turn token"):
        PolicyClient(random_cell, NoEos())
