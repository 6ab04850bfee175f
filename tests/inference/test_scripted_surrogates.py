"""ScriptedClient treats lone surrogates as `OpenAICompatibleClient` does: a reply holding one is
returned (a server's JSON reply can hold one) and the parser records the parse failure; a
request whose messages hold one is refused naming where. A reply with one raised a bare
UnicodeEncodeError from inside `complete`, failing the episode instead of the parse."""

from __future__ import annotations

import pytest

from ludic.agents import Agent
from ludic.envs.tictactoe import TicTacToeEnv
from ludic.inference.client import ChatRequest
from ludic.inference.scripted import IM_END, ScriptedClient, decode_ids
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.types import Message

_ASK = ChatRequest(messages=[{"role": "user", "content": "q"}])


async def test_a_reply_with_a_lone_surrogate_is_returned_with_byte_ids() -> None:
    client = ScriptedClient(["ok \ud800", ("cut \udc80", "length")])
    whole = await client.complete(_ASK)
    assert whole.text == "ok \ud800"
    assert whole.completion_token_ids == (*b"ok \xed\xa0\x80", IM_END)
    assert decode_ids(whole.completion_token_ids) == "ok \ufffd\ufffd\ufffd"  # as a server's ids
    assert whole.completion_logprobs is not None and len(whole.completion_logprobs) == 7
    cut = await client.complete(_ASK)
    assert cut.text == "cut \udc80" and cut.completion_token_ids == tuple(b"cut \xed\xb2\x80")


async def test_the_episode_records_a_parse_failure() -> None:
    agent = Agent(ScriptedClient(["<move>5\ud800</move>"]), parser=xml_tag_parser("move"))
    env = TicTacToeEnv(opponent="random")
    (rollout,) = await SingleAgentProtocol(agent, max_steps=1).run(env, env_seed=0)
    (step,) = rollout.agent_steps
    assert step.info["parse_error"] and step.parse_result is not None
    assert step.parse_result.action is None and "lone surrogate" in str(step.parse_result.obs)


async def test_a_message_with_a_lone_surrogate_is_refused_as_the_real_clients_refuse_it() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "ok"},
        {"role": "assistant", "content": "x\ud800"},
    ]
    with pytest.raises(ValueError, match=r"^messages\[1\]\.content holds a lone surrogate"):
        await ScriptedClient(["a"]).complete(ChatRequest(messages=messages))
    given_ids = ChatRequest(messages=messages, prompt_token_ids=(1, 2))  # token-in: not read
    assert (await ScriptedClient(["a"]).complete(given_ids)).prompt_token_ids == (1, 2)


async def test_valid_unicode_still_round_trips() -> None:
    client = ScriptedClient(["caf\u00e9 \U0001f600"])
    response = await client.complete(_ASK)
    assert decode_ids(response.completion_token_ids) == response.text == "caf\u00e9 \U0001f600"
