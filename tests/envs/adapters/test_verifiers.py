"""VerifiersEnv on real verifiers environment packages (defined beside this file, no network):
a single-turn taskset scored by its own `@reward` and parser, a multi-turn `Env` driving its
agent turn by turn, each model call a Ludic agent step with its tokens, the CLI's
`verifiers:TASKSET`, clear errors, and a short GRPO run on the tiny model."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs.adapters.verifiers import VerifiersEnv
from ludic.errors import is_refusal
from ludic.eval.env_spec import resolve_env_factory
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.types import Message, Rollout

pytest.importorskip("verifiers.v1", reason="needs verifiers: pip install 'ludic[verifiers]'")


def adder(messages: Sequence[Message]) -> str:
    """Answers `What is A + B?` right, in verifiers' `\\boxed{}` format."""
    a, b = map(int, re.findall(r"\d+", messages[-1]["content"] or ""))
    return f"The sum is \\boxed{{{a + b}}}."


async def play(env: VerifiersEnv, client: ScriptedClient, seed: int) -> Rollout:
    (rollout,) = await SingleAgentProtocol(Agent(client)).run(env, env_seed=seed)
    return rollout


async def test_single_turn_taskset_is_scored_by_its_own_rubric_and_parser() -> None:
    client = ScriptedClient(adder, policy_version=7)
    for seed in (0, 1, 6):  # 6 wraps to task 2 of 4
        rollout = await play(VerifiersEnv("vf_sum_taskset"), client, seed)
        (step,) = rollout.env_steps
        assert step.reward == 1.0 and step.terminated and step.info["vf_task_index"] == seed % 4
        assert step.info["vf_rewards"] == {"correct": 1.0}
    wrong = await play(VerifiersEnv("vf_sum_taskset"), ScriptedClient(["\\boxed{99}"]), 0)
    assert wrong.total_reward == 0.0
    unboxed = await play(VerifiersEnv("vf_sum_taskset"), ScriptedClient(["2"]), 0)
    assert unboxed.total_reward == 0.0  # verifiers' strict boxed parser finds no answer
    # the task's system prompt and prompt reach the Ludic agent as verifiers sent them
    system, user = client.requests[0].messages
    assert system == {"role": "system", "content": "Put the final answer in \\boxed{}."}
    assert user == {"role": "user", "content": "What is 0 + 2?"}


async def test_each_verifiers_model_call_is_a_ludic_agent_step_with_its_tokens() -> None:
    client = ScriptedClient(adder, policy_version=7)
    rollout = await play(VerifiersEnv("vf_sum_taskset"), client, 3)
    (agent_step,) = rollout.agent_steps
    assert agent_step.trace is not None and agent_step.policy_version == 7
    assert agent_step.trace.completion_token_ids and agent_step.trace.prompt_token_ids
    assert agent_step.trace.completion_logprobs is not None
    assert rollout.env_steps[0].action == "The sum is \\boxed{8}."  # unparsed: verifiers parses it


async def test_multi_turn_env_plays_every_turn_through_the_ludic_agent() -> None:
    client = ScriptedClient(["5", "2", "3"])  # secret 3: lower, higher, found
    rollout = await play(VerifiersEnv("vf_guess_env"), client, 0)
    assert [s.next_obs for s in rollout.env_steps[:2]] == ["lower", "higher"]
    assert [s.reward for s in rollout.env_steps] == [0.0, 0.0, pytest.approx(0.8)]
    assert rollout.env_steps[-1].terminated and len(rollout.agent_steps) == 3
    assert rollout.env_steps[-1].info["vf_num_turns"] == 3
    # the third call's prompt is the whole conversation verifiers replayed
    roles = [m["role"] for m in client.requests[2].messages]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert client.requests[2].messages[-1]["content"] == "higher"


async def test_a_multi_turn_episode_that_runs_out_of_guesses_scores_zero() -> None:
    rollout = await play(VerifiersEnv("vf_guess_env"), ScriptedClient(["1"]), 1)  # secret 6
    assert len(rollout.env_steps) == 4 and rollout.total_reward == 0.0
    assert rollout.env_steps[-1].terminated


async def test_verifiers_max_turns_ends_the_episode_as_a_truncation() -> None:
    client = ScriptedClient(["1"])  # secret 3: never found
    rollout = await play(VerifiersEnv("vf_guess_env", max_turns=2), client, 0)
    assert len(rollout.agent_steps) == client.calls == 2
    last = rollout.env_steps[-1]
    assert last.truncated and not last.terminated and last.truncation_reason == "env"
    assert last.info["vf_stop_condition"] == "max_turns" and rollout.total_reward == 0.0
    # the env's own seat settings stay unless overridden; harness and runtime become Ludic's
    seat = VerifiersEnv("vf_guess_env").vf_env.config.agent
    assert seat.max_turns == 6 and seat.runtime.type == "subprocess"


def test_taskset_config_and_num_tasks_pass_through_and_tasks_load_once() -> None:
    assert len(VerifiersEnv("vf_sum_taskset", taskset_config={"num_tasks": 9}).tasks) == 9
    assert len(VerifiersEnv("vf_sum_taskset", num_tasks=2).tasks) == 2
    # one env per episode, but the taskset's load() runs once per config
    assert VerifiersEnv("vf_sum_taskset").tasks is VerifiersEnv("vf_sum_taskset").tasks


def test_cli_resolves_verifiers_tasksets_without_a_ludic_parser() -> None:
    factory = resolve_env_factory("verifiers:vf_sum_taskset")
    assert getattr(factory, "parser", "unset") is None
    env = factory(num_tasks=3)
    assert isinstance(env, VerifiersEnv) and list(env.agent_ids) == ["agent"]


def test_an_unknown_taskset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="taskset 'no_such_taskset' not found") as caught:
        resolve_env_factory("verifiers:no_such_taskset")
    assert "pip install it" in str(caught.value)
    assert is_refusal(caught.value)  # `ludic train` prints one error line, not a traceback
    # a taskset that is there but fails to import one of its own dependencies is its bug
    with pytest.raises(ModuleNotFoundError, match="vf_broken_import_taskset"):
        resolve_env_factory("verifiers:vf_broken_import_taskset")


async def test_a_failing_verifiers_scorer_fails_the_episode_with_its_error() -> None:
    env = VerifiersEnv("vf_sum_taskset", taskset_config={"broken": True})
    with pytest.raises(RuntimeError, match=r"seat 'agent' failed: .*scorer of this task is broken"):
        await play(env, ScriptedClient(adder), 0)


def test_multi_seat_envs_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"seats \['assistant', 'user'\].*single-seat"):
        VerifiersEnv("vf_sum_taskset", env_id="user_sim")


def test_tasksets_with_tool_servers_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"tool servers \['EchoToolset'\].*tool calling"):
        VerifiersEnv("vf_tool_taskset")


def test_missing_verifiers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ImportError, match=r"pip install 'ludic\[verifiers\]'"):
        VerifiersEnv("vf_sum_taskset")


@pytest.mark.slow
def test_ludic_train_runs_grpo_on_a_verifiers_environment(tmp_path: Path) -> None:
    from ludic.recipes.configs import TrainConfig
    from ludic.recipes.train import train_command

    cfg = TrainConfig(
        env="verifiers:vf_sum_taskset",
        steps=2,
        problems_per_step=1,
        group_size=2,
        max_tokens=8,
        out_dir=tmp_path,
        progress=False,
    )
    result = train_command(cfg)
    assert result.steps == 2 and (result.checkpoint / "model" / "config.json").is_file()
    episodes = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(episodes) == 2 * 1 * 2
    assert all(not e["meta"].get("error") for e in episodes), episodes[0]["meta"]
    samples = [json.loads(line) for line in result.samples_jsonl.read_text().splitlines()]
    # one sample per verifiers model call, from the policy's own tokens and logprobs
    assert len(samples) == 4 and {tuple(s["meta"]["policy_versions"]) for s in samples} == {
        (0,),
        (1,),
    }
    assert all(sum(s["action_mask"]) > 0 and s["behavior_logprobs"] for s in samples)
