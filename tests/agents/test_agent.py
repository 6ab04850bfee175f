"""Agent: one model call per act, parsed; incomplete completions; buggy parsers; seeds."""

from __future__ import annotations

import pytest

from ludic.agents import Agent, derive_call_seed
from ludic.agents.base import INCOMPLETE_FEEDBACK, resolve_sampling
from ludic.envs import SingleAgentEnv
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
    agent = Agent(
        client,
        parser=xml_tag_parser("move"),
        incomplete_penalty=-0.7,
        reject_incomplete_completions=True,
    )
    started(agent)
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


async def test_incomplete_completion_goes_to_the_parser_by_default() -> None:
    seen: list[str] = []

    def parser(text: str) -> ParseResult:
        seen.append(text)
        return xml_tag_parser("move")(text)

    client = ScriptedClient([("<move>3</move> and then", "length")])
    act = await started(Agent(client, parser=parser)).act(turn_id="t")
    assert seen == ["<move>3</move> and then"]  # the user's parser saw the cut-off reply
    assert act.action == "3" and "incomplete_completion" not in act.final_step.info
    assert act.final_step.finish_reason == "length"


def test_sampling_precedence_agent_fields_then_request_then_defaults() -> None:
    agent = SamplingConfig(max_tokens=4, stop=("x",), extras={"a": 1, "b": 2})
    request = SamplingConfig(temperature=0.5, max_tokens=64, seed=9, extras={"b": 3, "c": 4})
    cfg = resolve_sampling(request, agent)
    assert cfg.max_tokens == 4 and cfg.stop == ("x",)  # the agent set them
    assert cfg.temperature == 0.5 and cfg.seed == 9  # the request set them, the agent did not
    assert cfg.top_p == 1.0 and cfg.top_k == -1  # nobody did: the defaults
    assert cfg.extras == {"a": 1, "b": 2, "c": 4}
    assert resolve_sampling(None, agent) == agent
    assert resolve_sampling(request, None) == request
    assert resolve_sampling(None, None) == SamplingConfig()
    assert resolve_sampling(SamplingConfig(), SamplingConfig(seed=5)).seed == 5


async def test_agent_max_tokens_wins_over_the_request_default() -> None:
    client = ScriptedClient(["a"])
    agent = started(Agent(client, sampling=SamplingConfig(max_tokens=4)))
    await agent.act(turn_id="t", sampling=SamplingConfig(temperature=0.3))  # max_tokens 256
    sent = client.requests[0].sampling
    assert sent.max_tokens == 4 and sent.temperature == 0.3


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
    # A per-act (request) seed wins over the agent's; without one the agent's seed stays.
    client = ScriptedClient(["a"])
    agent = started(Agent(client, sampling=SamplingConfig(seed=1)))
    await agent.act(turn_id="t", sampling=SamplingConfig(temperature=0.0, seed=3))
    await agent.act(turn_id="t", sampling=SamplingConfig(temperature=0.0))
    assert [r.sampling.seed for r in client.requests] == [
        derive_call_seed(3, 0),
        derive_call_seed(1, 1),
    ]
    assert client.requests[0].sampling.temperature == 0.0
    # No seed anywhere stays no seed.
    client = ScriptedClient(["a"])
    await started(Agent(client)).act(turn_id="t", sampling=SamplingConfig(temperature=0.0))
    assert client.requests[0].sampling.seed is None


@pytest.mark.parametrize("base", [0, 1, 2**31, 123456789])
def test_derive_call_seed_is_in_range_and_distinct(base: int) -> None:
    seeds = [derive_call_seed(base, i) for i in range(1000)]
    assert len(set(seeds)) == 1000
    assert all(s is not None and 0 <= s < 2**31 - 1 for s in seeds)
    assert derive_call_seed(None, 3) is None


@pytest.mark.slow
async def test_agent_max_tokens_holds_through_the_rollout_engine_on_a_tiny_model() -> None:
    """The issue's case: a request with default sampling (256 tokens) must not undo the
    agent's `max_tokens=4`, end to end through RolloutEngine and the embedded engine."""
    from ludic.inference.embedded.engine import EmbeddedEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.models import build_tiny_model
    from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
    from ludic.types import Info, StepOutcome

    class OneTurn(SingleAgentEnv):
        def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
            return "Say something.", {}

        def env_step(self, action: str) -> StepOutcome:
            return StepOutcome(obs="", reward=0.0, terminated=True)

    model, tokenizer = build_tiny_model(seed=0)
    with EmbeddedEngine(model, tokenizer) as engine:
        rollouts = await RolloutEngine(
            env_registry={"one": OneTurn},
            protocol_registry={
                "p": lambda: SingleAgentProtocol(
                    Agent(engine, sampling=SamplingConfig(max_tokens=4)), max_steps=1
                )
            },
        ).run(
            [
                RolloutRequest(env=ComponentSpec(name="one"), protocol=ComponentSpec(name="p"))
                for _ in range(6)
            ]
        )
    steps = [s for r in rollouts for s in r.agent_steps]
    assert len(steps) == 6 and not any(r.failed for r in rollouts)
    lengths = [len(s.trace.completion_token_ids) for s in steps if s.trace is not None]
    assert len(lengths) == 6 and max(lengths) <= 4
    assert all(s.info["sampling"]["max_tokens"] == 4 for s in steps if "sampling" in s.info)
