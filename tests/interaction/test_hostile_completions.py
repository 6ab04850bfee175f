"""Malformed model outputs are recorded parse failures that never reach the env: nested tags
(which of `<move>a<move>b</move>` the model meant is a guess; before, `a<move>b` went to the
env as the move) and an action holding a lone surrogate (a server's JSON `\\ud800` escape;
before, it went to the env, and no log file or next request could carry it). Each built-in
parser, then whole episodes through `SingleAgentProtocol`."""

from __future__ import annotations

import dataclasses
import json

import pytest
from interaction_fakes import CountingEnv

from ludic.agents import Agent
from ludic.inference import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import (
    Parser,
    boxed_parser,
    compose_parsers,
    identity_parser,
    think_prefix_parser,
    xml_tag_parser,
)
from ludic.types import ParseResult

LONE = "\ud800"
CASES: list[tuple[str, Parser, str, str]] = [
    ("nested", xml_tag_parser("move"), "<move><move>a1</move></move>", "do not nest"),
    ("nested inner", xml_tag_parser("move"), "<move>a<move>b</move>c</move>", "do not nest"),
    ("unclosed first", xml_tag_parser("move", exactly_one=True), "<move>a <move>b</move>", "nest"),
    ("surrogate xml", xml_tag_parser("move"), f"<move>a{LONE}</move>", "at character 1"),
    ("surrogate think", think_prefix_parser(), f"<think>x</think>b{LONE}", "lone surrogate"),
    ("surrogate bare", think_prefix_parser(require=False), f"{LONE}x", "at character 0"),
    ("surrogate boxed", boxed_parser(), "\\boxed{\udfff}", "lone surrogate"),
    ("surrogate identity", identity_parser, " \udc80 ", "lone surrogate"),
    (
        "surrogate composed",
        compose_parsers(think_prefix_parser(), xml_tag_parser("move")),
        f"<think>{LONE}</think><move>{LONE}</move>",
        "lone surrogate",
    ),
]


@pytest.mark.parametrize(("name", "parse", "text", "feedback"), CASES, ids=[c[0] for c in CASES])
def test_each_parser_fails_with_feedback_the_next_request_can_carry(
    name: str, parse: Parser, text: str, feedback: str
) -> None:
    result = parse(text)
    assert isinstance(result, ParseResult) and result.action is None
    assert result.reward < 0 and result.obs is not None and feedback in result.obs
    result.obs.encode("utf-8")  # the feedback itself is valid text


def test_a_surrogate_outside_the_action_is_not_a_failure() -> None:
    """Only the action has to be valid: a thought may hold what the action does not."""
    parse = compose_parsers(think_prefix_parser(), xml_tag_parser("move"))
    assert parse(f"<think>{LONE}</think><move>a1</move>").action == "a1"
    assert xml_tag_parser("move")("<move>é 🤖</move>").action == "é 🤖"


class ServerText(ScriptedClient):
    """Scripted replies whose text is `SURROGATE` where the script says so: the text an
    OpenAI-compatible server's JSON reply decodes to (token ids cannot hold a surrogate)."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        response = await super().complete(request)
        return dataclasses.replace(response, text=response.text.replace("SURROGATE", LONE))


async def test_the_episode_records_a_parse_failure_and_the_env_never_sees_it() -> None:
    env = CountingEnv(length=1)
    replies = ["<move><move>good</move></move>", "<move>good</move>"]
    agent = Agent(ScriptedClient(replies), parser=xml_tag_parser("move"))
    (rollout,) = await SingleAgentProtocol(agent, max_steps=4).run(env, env_seed=1)
    assert env.actions == ["good"]  # only the well-formed second reply reached the env
    first = rollout.agent_steps[0]
    assert first.info["parse_error"] and first.parse_result is not None
    assert first.parse_result.action is None and first.reward < 0
    assert rollout.env_steps[-1].terminated
    json.loads(json.dumps(rollout.to_dict()))


async def test_an_action_with_a_lone_surrogate_is_a_parse_failure_in_the_episode() -> None:
    """One turn: the next turn's request would carry the completion, which no client can send
    (`OpenAICompatibleClient` refuses it, failing that episode alone)."""
    env = CountingEnv(length=1)
    agent = Agent(ServerText(["<move>goodSURROGATE</move>"]), parser=xml_tag_parser("move"))
    (rollout,) = await SingleAgentProtocol(agent, max_steps=1).run(env, env_seed=1)
    assert env.actions == []
    (step,) = rollout.agent_steps
    assert step.info["parse_error"] and step.parse_result is not None
    assert step.parse_result.action is None and "lone surrogate" in str(step.parse_result.obs)
