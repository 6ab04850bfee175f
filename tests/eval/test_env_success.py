"""Success is the env's verdict where it gives one (`info["success"]`, else `info["correct"]`,
on the step that ends the episode), not the sign of the total reward: a puzzle solved after
parse penalties is a success, a partial score is not. Each bundled env that knows its outcome
says so; episodes run through the real protocol and are summarised as `ludic eval` does."""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from ludic.agents import Agent
from ludic.context import LatestObservationContext
from ludic.envs import DatasetQAEnv
from ludic.envs.code_env import CodeTestEnv, load_code_problems
from ludic.envs.tictactoe import TicTacToeEnv
from ludic.envs.tictactoe_duel import TicTacToeDuelEnv
from ludic.eval import summarise
from ludic.eval.records import episode_record, reward_success
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.recipes.tictactoe import expert_policy, protocol_factory
from ludic.types import EnvironmentStep, Message, ParseResult, Rollout

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def lights_module() -> object:
    sys.path.insert(0, str(EXAMPLES / "custom_env"))
    try:
        import lights
    finally:
        sys.path.remove(str(EXAMPLES / "custom_env"))
    return lights


async def test_lights_solved_after_parse_penalties_is_a_success() -> None:
    lights = lights_module()
    calls: list[int] = []

    def reply(messages: Sequence[Message]) -> str:
        calls.append(1)
        if len(calls) <= 6:
            return "I am not sure"  # a parse failure: -0.2 each
        shown = next(str(m["content"]) for m in reversed(messages) if "Lamps:" in str(m["content"]))
        lamps = re.findall(r"(\d) (on|off)", shown)
        return next(n for n, state in lamps if state == "off")

    agent = Agent(
        ScriptedClient(reply),
        context=LatestObservationContext(),
        parser=lights.lamp_parser,  # type: ignore[attr-defined]
        system_prompt=lights.LightsEnv.system_prompt,  # type: ignore[attr-defined]
    )
    protocol = SingleAgentProtocol(agent, max_steps=12)
    (rollout,) = await protocol.run(lights.LightsEnv(), env_seed=0)  # type: ignore[attr-defined]
    assert rollout.env_steps[-1].terminated and rollout.total_reward < 0  # solved, penalised
    (unsolved,) = await SingleAgentProtocol(
        Agent(
            ScriptedClient(["no idea"]),
            context=LatestObservationContext(),
            parser=lights.lamp_parser,  # type: ignore[attr-defined]
        ),
        max_steps=3,
    ).run(lights.LightsEnv(), env_seed=0)  # type: ignore[attr-defined]
    result = summarise([rollout, unsolved])
    assert [e.success for e in result.episodes] == [True, False]
    assert result.episodes[0].outcome == "success"  # was "failure": total reward <= 0
    assert result.metrics["outcome/success"] == 0.5
    assert result.metrics["success_rate"] == 0.5


def illegal_twice_then_expert() -> ScriptedClient:
    """Two moves off the board (penalised, retried), then minimax moves."""
    policy, calls = expert_policy(0.0), []

    def reply(messages: Sequence[Message]) -> str:
        calls.append(1)
        return "<move>0</move>" if len(calls) <= 2 else policy(messages, random.Random(0))

    return ScriptedClient(reply)


async def test_tictactoe_won_after_illegal_moves_is_a_success() -> None:
    env = TicTacToeEnv(opponent="random", illegal_move="retry")
    (rollout,) = await protocol_factory(illegal_twice_then_expert())().run(env, env_seed=0)
    assert rollout.env_steps[-1].info["outcome"] == "win" and rollout.total_reward <= 0
    record = episode_record(rollout)
    assert record.success and record.outcome == "win"
    env = TicTacToeEnv(opponent="random", illegal_move="end")
    (lost,) = await protocol_factory(ScriptedClient(["<move>0</move>"]))().run(env, env_seed=0)
    assert episode_record(lost).outcome == "illegal" and not reward_success(lost)


async def test_the_duel_says_which_seat_won_whatever_its_penalties() -> None:
    move = xml_tag_parser("move")
    penalised = ParseResult(action=None, reward=-3.0, obs="Could not find <move>...</move>.")

    def strict(text: str) -> ParseResult:
        parsed = move(text)
        return parsed if parsed.action is not None else penalised

    x = ScriptedClient(["no move here", "<move>1</move>", "<move>2</move>", "<move>3</move>"])
    o = ScriptedClient(["<move>4</move>", "<move>5</move>"])
    protocol = MultiAgentProtocol(
        {
            "X": Agent(x, context=LatestObservationContext(), parser=strict),
            "O": Agent(o, context=LatestObservationContext(), parser=strict),
        }
    )
    rollouts = await protocol.run(TicTacToeDuelEnv(), env_seed=0)
    by_seat = {r.agent_id: r for r in rollouts}
    assert by_seat["X"].total_reward < 0  # won, after a -3 parse penalty
    assert by_seat["X"].env_steps[-1].info["outcome"] == "win"
    assert reward_success(by_seat["X"]) and not reward_success(by_seat["O"])


@pytest.mark.parametrize(
    ("program", "reward", "solved"),
    [("print(abs(a + b))", 0.75, False), ("print(a + b)", 1.0, True)],
)
async def test_code_is_solved_only_when_every_test_passes(
    program: str, reward: float, solved: bool
) -> None:
    problems = load_code_problems()
    env = CodeTestEnv(problems, scoring="fraction")
    code = f"```python\na, b = map(int, input().split())\n{program}\n```"
    agent = Agent(ScriptedClient([code]), system_prompt=CodeTestEnv.system_prompt)
    seed = [p.id for p in problems].index("sum_two")
    (rollout,) = await SingleAgentProtocol(agent).run(env, env_seed=seed)
    assert rollout.total_reward == reward  # 3 of 4 tests: a positive reward, not solved
    record = episode_record(rollout)
    assert record.success is solved and record.outcome == ("success" if solved else "failure")


async def test_a_correct_answer_is_a_success_whatever_the_parser_cost() -> None:
    def costly(text: str) -> ParseResult:
        return ParseResult(action=text.strip(), reward=-2.0)  # e.g. a format penalty

    def half(prediction: str, target: str) -> float:
        return 1.0 if prediction == target else 0.5

    env = DatasetQAEnv([{"question": "2+2?", "answer": "4"}], verifier=half)
    rollouts: list[Rollout] = []
    for answer in ("4", "5"):
        agent = Agent(ScriptedClient([answer]), parser=costly)
        rollouts += await SingleAgentProtocol(agent).run(env, env_seed=0)
    right, partial = (episode_record(r) for r in rollouts)
    assert rollouts[0].total_reward < 0 and right.success and right.outcome == "correct"
    assert rollouts[1].total_reward == 0.5 - 2.0 and not partial.success
    assert partial.outcome == "incorrect"


def test_an_env_without_a_verdict_keeps_the_reward_rule() -> None:
    def rollout(reward: float, info: dict[str, object]) -> Rollout:
        return Rollout(steps=[EnvironmentStep(terminated=True, reward=reward, info=info)])

    assert reward_success(rollout(1.0, {})) and not reward_success(rollout(0.0, {}))
    assert not reward_success(rollout(1.0, {"success": False}))
    assert reward_success(rollout(-1.0, {"success": True}))
    assert reward_success(rollout(-1.0, {"correct": True}))
    assert reward_success(rollout(1.0, {"success": "yes"}))  # not a bool: no verdict
