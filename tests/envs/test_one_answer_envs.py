"""One question, one answer: the single-answer envs (DatasetQAEnv and the `math_qa` env built
on it, CodeTestEnv, the delegation TaskEnv) end the episode at a reply that fails to parse, as a
recorded parse failure with the parser's penalty, whatever `max_steps` allows; format retries
are an explicit `parse_failure_ends_episode=False`. The same holds through `run_eval`, so a
format retry never counts toward pass@1."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.agents import Agent, ToolAgent
from ludic.envs import make_env
from ludic.envs.code_env import CodeProblem, CodeTest, CodeTestEnv, code_test_env
from ludic.envs.dataset_qa import DatasetQAEnv
from ludic.eval import make_eval_requests, run_eval
from ludic.inference import ScriptedClient
from ludic.interaction import (
    DelegatingProtocol,
    SingleAgentProtocol,
    SubAgentSpec,
    TaskEnv,
    delegate,
)
from ludic.parsers import DEFAULT_PENALTY, boxed_parser, xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine
from ludic.types import Rollout

SUMS = [{"question": "2+2?", "answer": "4"}, {"question": "3+4?", "answer": "7"}]
RIGHT = {"2+2?": "4", "3+4?": "7"}


def slip_then_right() -> ScriptedClient:
    """In each episode: first a reply without `\\boxed{}`, then the right boxed answer."""

    def reply(messages: list[dict[str, str]]) -> str:
        question = next(m["content"] for m in messages if m["role"] == "user")
        if not any(m["role"] == "assistant" for m in messages):
            return f"the answer is {RIGHT[question]}"
        return f"\\boxed{{{RIGHT[question]}}}"

    return ScriptedClient(reply)


def assert_one_recorded_parse_failure(rollout: Rollout) -> None:
    (step,) = rollout.env_steps  # no second reply after the format slip
    assert step.action is None and step.info["parse_error"] and step.terminated
    assert step.info["termination_reason"] == "parse_error"
    assert rollout.meta["termination_reason"] == "parse_error"
    assert "episode_truncated" not in rollout.meta
    assert len(rollout.agent_steps) == 1
    assert rollout.total_reward == pytest.approx(DEFAULT_PENALTY)


@pytest.mark.parametrize("max_steps", [1, 10])
async def test_a_format_slip_ends_a_qa_episode_as_one_parse_failure(max_steps: int) -> None:
    """Recorded the same whatever the step bound (at 1 it is not a max_steps truncation)."""
    agent = Agent(slip_then_right(), parser=boxed_parser())
    protocol = SingleAgentProtocol(agent, max_steps=max_steps)
    (rollout,) = await protocol.run(DatasetQAEnv(SUMS), env_seed=0)
    assert_one_recorded_parse_failure(rollout)
    assert not rollout.env_steps[0].truncated


async def test_format_retries_are_an_explicit_option() -> None:
    env = DatasetQAEnv(SUMS, parse_failure_ends_episode=False)
    agent = Agent(slip_then_right(), parser=boxed_parser())
    (rollout,) = await SingleAgentProtocol(agent, max_steps=10).run(env, env_seed=0)
    slip, answer = rollout.env_steps
    assert slip.info["parse_error"] and not slip.terminated
    assert answer.action == "4" and answer.info["correct"] and answer.terminated
    assert rollout.meta["termination_reason"] == "env_terminated"


def test_math_qa_takes_one_answer_unless_told_otherwise() -> None:
    assert make_env("math_qa", limit=2).parse_failure_ends_episode is True
    retries = make_env("math_qa", limit=2, parse_failure_ends_episode=False)
    assert retries.parse_failure_ends_episode is False
    with pytest.raises(TypeError, match="parse_failure_ends_episode must be true or false"):
        make_env("math_qa", parse_failure_ends_episode="false")


async def test_pass_at_1_on_math_qa_counts_first_answers_only(tmp_path: Path) -> None:
    """Same engine path `ludic eval` and `ludic train` take: the env's own setting decides."""

    def run_on(client: ScriptedClient) -> RolloutEngine:
        def protocol() -> SingleAgentProtocol:
            return SingleAgentProtocol(Agent(client, parser=boxed_parser()), max_steps=10)

        def env(**kwargs: object) -> DatasetQAEnv:
            return DatasetQAEnv(SUMS, **kwargs)  # type: ignore[arg-type]

        return RolloutEngine(env_registry={"sums": env}, protocol_registry={"single": protocol})

    async def metrics(**env_kwargs: object) -> tuple[dict[str, float], int]:
        client = slip_then_right()
        requests = make_eval_requests(
            env=ComponentSpec(name="sums", kwargs=env_kwargs),
            protocol=ComponentSpec(name="single"),
            num_problems=2,
            samples_per_problem=2,
        )
        out = tmp_path / str(len(env_kwargs))
        result = await run_eval(run_on(client), requests, out_dir=out)
        return result.metrics, len(client.requests)

    one, calls = await metrics()
    assert (one["pass@1"], one["success_rate"], one["parse_errors/mean"]) == (0.0, 0.0, 1.0)
    assert one["reward/mean"] == pytest.approx(DEFAULT_PENALTY) and calls == 4
    retried, calls = await metrics(parse_failure_ends_episode=False)
    assert retried["pass@1"] == 1.0 and retried["parse_errors/mean"] == 1.0 and calls == 8


ECHO = CodeProblem(id="echo", prompt="Echo the input.", tests=(CodeTest(input="a", output="a"),))


async def test_code_env_ends_at_a_parse_failure_without_running_code() -> None:
    replies = ScriptedClient(["no code here", "<code>print(input())</code>"])
    agent = Agent(replies, parser=xml_tag_parser("code"))
    env = CodeTestEnv([ECHO])
    (rollout,) = await SingleAgentProtocol(agent, max_steps=5).run(env, env_seed=0)
    assert_one_recorded_parse_failure(rollout)
    assert code_test_env(parse_failure_ends_episode=False).parse_failure_ends_episode is False
    with pytest.raises(TypeError, match="parse_failure_ends_episode"):
        CodeTestEnv([ECHO], parse_failure_ends_episode=1)  # type: ignore[arg-type]


CALL = '<tool_call>{"name": "delegate", "arguments": {"task": "2+2?"}}</tool_call>'


def boss() -> ToolAgent:
    """Delegates "2+2?" once, then answers."""
    return ToolAgent(
        ScriptedClient([CALL, "<move>done</move>"]),
        external_tools=[delegate],
        parser=xml_tag_parser("move"),
    )


async def test_a_sub_agent_answers_its_task_once() -> None:
    def helper() -> Agent:
        return Agent(ScriptedClient(["four", "<move>4</move>"]), parser=xml_tag_parser("move"))

    spec = SubAgentSpec(agent_factory=helper, env_factory=TaskEnv, max_steps=4)
    parent, child = await DelegatingProtocol(boss(), {"default": spec}).run(
        TaskEnv("boss task"), env_seed=0
    )
    assert_one_recorded_parse_failure(child)
    assert parent.agent_steps[0].tool_results[0].content == "four"  # its raw reply goes back
    retry = SubAgentSpec(
        agent_factory=helper,
        env_factory=lambda task: TaskEnv(task, parse_failure_ends_episode=False),
        max_steps=4,
    )
    _, child = await DelegatingProtocol(boss(), {"default": retry}).run(
        TaskEnv("boss task"), env_seed=0
    )
    assert [s.action for s in child.env_steps] == [None, "4"]


def test_a_subclass_sets_the_flag_as_a_class_attribute_and_the_argument_wins() -> None:
    """LudicEnv documents `parse_failure_ends_episode` as a class attribute: a subclass of a
    one-answer env that sets it False keeps it (the constructor used to overwrite it with
    True); an explicit argument still wins, and a non-bool is refused."""

    class RetryingQA(DatasetQAEnv):
        parse_failure_ends_episode = False

    class RetryingCode(CodeTestEnv):
        parse_failure_ends_episode = False

    class RetryingTask(TaskEnv):
        parse_failure_ends_episode = False

    problem = ECHO
    data = [{"question": "1+1?", "answer": "2"}]
    assert RetryingQA(data).parse_failure_ends_episode is False
    assert RetryingCode([problem]).parse_failure_ends_episode is False
    assert RetryingTask("t").parse_failure_ends_episode is False
    assert DatasetQAEnv(data).parse_failure_ends_episode is True
    assert CodeTestEnv([problem]).parse_failure_ends_episode is True
    assert TaskEnv("t").parse_failure_ends_episode is True
    assert RetryingQA(data, parse_failure_ends_episode=True).parse_failure_ends_episode is True
    assert DatasetQAEnv(data, parse_failure_ends_episode=False).parse_failure_ends_episode is False
    with pytest.raises(TypeError, match="must be true or false"):
        DatasetQAEnv(data, parse_failure_ends_episode="false")  # type: ignore[arg-type]
