"""reasoning-gym is one question, one answer: a reply without a parseable `<answer>` ends the
episode as a recorded parse failure with the parser's penalty (no retries up to --max-steps),
so an episode never scores below one penalty and pass@1 counts first answers only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.envs.adapters.reasoning_gym import ReasoningGymEnv, answer_parser
from ludic.eval import make_eval_requests, run_eval
from ludic.inference import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import DEFAULT_PENALTY
from ludic.rollouts import ComponentSpec, RolloutEngine

rg = pytest.importorskip(
    "reasoning_gym", reason="needs reasoning-gym: pip install 'ludic[reasoning-gym]'"
)

NAME, CONFIG = "basic_arithmetic", {"size": 8, "dataset_seed": 3}


def right_after_a_format_slip() -> ScriptedClient:
    """In each episode, replies without the answer tags first, then with the right answer."""
    answers = {e["question"]: e["answer"] for e in rg.create_dataset(NAME, seed=3, size=8)}

    def reply(messages: list[dict[str, str]]) -> str:
        question = next(m["content"] for m in messages if m["role"] == "user")
        if not any(m["role"] == "assistant" for m in messages):
            return f"the answer is {answers[question]}"
        return f"<answer>{answers[question]}</answer>"

    return ScriptedClient(reply)


async def test_an_unparseable_reply_ends_the_episode_as_a_parse_failure() -> None:
    agent = Agent(right_after_a_format_slip(), parser=answer_parser())
    env = ReasoningGymEnv(NAME, **CONFIG)
    (rollout,) = await SingleAgentProtocol(agent, max_steps=10).run(env, env_seed=0)
    (step,) = rollout.env_steps  # one reply, not a retry after the format slip
    assert step.action is None and step.info["parse_error"] and step.terminated
    assert rollout.meta["termination_reason"] == "parse_error"
    assert rollout.total_reward == pytest.approx(DEFAULT_PENALTY)
    assert len(rollout.agent_steps) == 1


async def test_pass_at_1_counts_first_answers_only(tmp_path: Path) -> None:
    client = right_after_a_format_slip()
    engine = RolloutEngine(
        env_registry={NAME: lambda **kw: ReasoningGymEnv(NAME, **kw)},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(
                Agent(client, parser=answer_parser()), max_steps=10
            )
        },
    )
    requests = make_eval_requests(
        env=ComponentSpec(name=NAME, kwargs=CONFIG),
        protocol=ComponentSpec(name="single"),
        num_problems=4,
        samples_per_problem=2,
    )
    result = await run_eval(engine, requests, out_dir=tmp_path)
    assert result.metrics["pass@1"] == 0.0  # every first answer was a format slip
    assert result.metrics["success_rate"] == 0.0
    assert result.metrics["reward/mean"] == pytest.approx(DEFAULT_PENALTY)
    assert len(client.requests) == 8  # one call per episode


@pytest.mark.slow
def test_ludic_eval_on_reasoning_gym_asks_once_per_question(tmp_path: Path) -> None:
    """A fresh tiny model writes no `<answer>` tags: each episode is one call and one
    penalty (before: ten calls, -10), whatever --max-steps allows."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = ["--env", f"reasoning_gym:{NAME}", "--env-kwargs", json.dumps(CONFIG)]
    args += ["--num-problems", "3", "--max-steps", "10", "--max-tokens", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "ludic.cli", "eval", *args, "--out-dir", str(tmp_path)],
        env={**env, "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 3
    for rollout in rollouts:
        calls = [s for s in rollout["steps"] if s.get("kind", "agent") == "agent"]
        assert len(calls) == 1
        assert rollout["meta"]["termination_reason"] == "parse_error"
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["reward/mean"] == pytest.approx(DEFAULT_PENALTY)
    assert metrics["success_rate"] == 0.0
