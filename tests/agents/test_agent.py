"""Agent: one model call per act, parsed; incomplete completions; buggy parsers; seeds."""

from __future__ import annotations

import pytest

from ludic.agents import Agent, derive_call_seed
from ludic.agents.base import INCOMPLETE_FEEDBACK
from ludic.inference.sampling import SamplingConfig
from ludic.inference.scripted import IM_END, ScriptedClient, encode_text, render_chatml_ids
from ludic.parsers import DEFAULT_PENALTY, xml_tag_parser
from ludic.types import ParseResult


def started(agent: Agent, obs: str = "obs0") -> Agent:
    agent.reset("env system prompt")
    agent.on_env_reset(obs, {})
    return agent


async def test_act_records_one_step_with_trace_and_parse_result() -> None:
    client = ScriptedClient(["<move>3</move>"], policy_version=2)
    agent = started(Agent(client, parser=xml_tag_parser("move", success_reward=0.5)))
    act = await agent.act(turn_id="t0", step_info={"observation": "obs0", "state_key": "k"})
    assert act.action == "3" and act.parse_result == ParseResult(action="3", reward=0.5)
    (step,) = act.steps
    assert act.final_step is step
    assert (step.turn_id, step.agent_id, step.loop_index, step.action_target) == (
        "t0",
        "agent_0",
        0,
        "env",
    )
    assert step.completion == "<move>3</move>" and step.reward == 0.5
    assert step.finish_reason == "stop" and step.policy_version == 2
    assert step.prompt_messages == (
        {"role": "system", "content": "env system prompt"},
        {"role": "user", "content": "obs0"},
    )
    assert step.trace is not None
    assert step.trace.prompt_token_ids == tuple(render_chatml_ids(step.prompt_messages))
    assert step.trace.completion_token_ids == (*encode_text("<move>3</move>"), IM_END)
    assert step.info["observation"] == "obs0" and step.info["state_key"] == "k"
    assert step.info["finish_reason"] == "stop" and "parse_error" not in step.info
    # The reply joined the context.
    assert agent.context.messages[-1] == {"role": "assistant", "content": "<move>3</move>"}


async def test_agent_system_prompt_wins_over_the_envs() -> None:
    agent = Agent(ScriptedClient(["x"]), system_prompt="mine")
    agent.reset("env's")
    assert agent.context.messages == [{"role": "system", "content": "mine"}]


async def test_parse_failure_is_recorded_with_penalty_and_feedback() -> None:
    agent = started(Agent(ScriptedClient(["no tag"]), parser=xml_tag_parser("move", penalty=-0.3)))
    act = await agent.act(turn_id="t")
    assert act.action is None and act.parse_result is not None
    assert act.parse_result.obs is not None and "<move>" in act.parse_result.obs
    (step,) = act.steps
    assert step.reward == -0.3 and step.info["parse_error"] is True
    assert step.action_target == "env" and step.parse_result == act.parse_result


async def test_incomplete_completion_is_rejected_but_kept_in_context() -> None:
    client = ScriptedClient([("<move>3</move> and then I ran out", "length")])
    agent = started(Agent(client, parser=xml_tag_parser("move"), incomplete_penalty=-0.7))
    act = await agent.act(turn_id="t")
    (step,) = act.steps
    assert act.action is None  # even though the text holds a valid tag
    assert act.parse_result == ParseResult(action=None, reward=-0.7, obs=INCOMPLETE_FEEDBACK)
    assert step.info["incomplete_completion"] is True and step.info["parse_error"] is True
    assert step.finish_reason == "length" and step.info["finish_reason"] == "length"
    assert step.reward == -0.7
    assert agent.context.messages[-1] == {
        "role": "assistant",
        "content": "<move>3</move> and then I ran out",
    }


async def test_incomplete_completion_goes_to_the_parser_when_not_rejected() -> None:
    client = ScriptedClient([("<move>3</move> and then", "length")])
    agent = started(
        Agent(client, parser=xml_tag_parser("move"), reject_incomplete_completions=False)
    )
    act = await agent.act(turn_id="t")
    assert act.action == "3" and "incomplete_completion" not in act.final_step.info
    assert act.final_step.finish_reason == "length"


async def test_a_parser_that_raises_is_a_parse_failure() -> None:
    def broken(text: str) -> ParseResult:
        raise KeyError("oops")

    agent = started(Agent(ScriptedClient(["x"]), parser=broken))
    act = await agent.act(turn_id="t")
    assert act.action is None and act.parse_result is not None
    assert act.parse_result.reward == DEFAULT_PENALTY
    assert act.parse_result.obs == "Your reply could not be parsed (KeyError)."
    assert act.final_step.info["parser_exception"] == "KeyError: 'oops'"
    assert act.final_step.info["parse_error"] is True


async def test_step_indices_count_across_the_episode_and_reset() -> None:
    agent = started(Agent(ScriptedClient(["a"])))
    first = await agent.act(turn_id="t0")
    second = await agent.act(turn_id="t1")
    assert [first.final_step.index, second.final_step.index] == [0, 1]
    started(agent)
    assert (await agent.act(turn_id="t2")).final_step.index == 0


async def test_each_call_gets_a_distinct_deterministic_seed() -> None:
    async def seeds(episode_seed: int) -> list[int | None]:
        client = ScriptedClient(["a"])
        agent = started(Agent(client, sampling=SamplingConfig(seed=episode_seed)))
        for i in range(4):
            await agent.act(turn_id=f"t{i}")
        return [r.sampling.seed for r in client.requests]

    a, b = await seeds(7), await seeds(7)
    assert a == b and len(set(a)) == 4
    assert a == [derive_call_seed(7, i) for i in range(4)]
    assert set(a).isdisjoint(await seeds(8))
    # A per-act sampling overrides the agent's; no seed stays no seed.
    client = ScriptedClient(["a"])
    agent = started(Agent(client, sampling=SamplingConfig(seed=1)))
    await agent.act(turn_id="t", sampling=SamplingConfig(temperature=0.0))
    assert client.requests[0].sampling.seed is None
    assert client.requests[0].sampling.temperature == 0.0


@pytest.mark.parametrize("base", [0, 1, 2**31, 123456789])
def test_derive_call_seed_is_in_range_and_distinct(base: int) -> None:
    seeds = [derive_call_seed(base, i) for i in range(1000)]
    assert len(set(seeds)) == 1000
    assert all(s is not None and 0 <= s < 2**31 - 1 for s in seeds)
    assert derive_call_seed(None, 3) is None
