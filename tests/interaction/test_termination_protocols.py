"""Termination rules in every protocol: each rule ends the episode of SingleAgentProtocol,
MultiAgentProtocol and DelegatingProtocol alike, and the reason is recorded identically (last
env step flags and info, rollout meta). Plus what only multi-agent and delegation add: a rule
ends every seat's episode; a sub-agent's episode follows its SubAgentSpec's rules."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from interaction_fakes import CoinDuelEnv, OneReplyTapeEnv, RockPaperScissorsEnv, TapeEnv

from ludic.agents import Agent, ToolAgent
from ludic.eval import episode_record, step_records
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import (
    ContextBudget,
    CriticalError,
    DelegatingProtocol,
    InteractionProtocol,
    MaxSteps,
    MultiAgentProtocol,
    OutputRegex,
    SingleAgentProtocol,
    SubAgentSpec,
    TaskEnv,
    TerminateAction,
    TerminationRule,
    delegate,
)
from ludic.parsers import xml_tag_parser
from ludic.types import Rollout, StepOutcome

MOVE = xml_tag_parser("move")


class BothFlagsTapeEnv(TapeEnv):
    """Ends at step 1 both terminated and truncated (a time limit hit on the winning step)."""

    def env_step(self, action: str) -> StepOutcome:
        outcome = super().env_step(action)
        return dataclasses.replace(outcome, terminated=True, truncated=True)


def boom(x: int) -> int:
    """Always fails."""
    raise RuntimeError("no")


TOOL_CALL = '<tool_call>{"name": "boom", "arguments": {"x": 1}}</tool_call>'


@dataclass(frozen=True)
class Case:
    """One way an episode ends: the agent's replies, the rules, the env, and the record every
    protocol must produce: (termination_reason, termination_detail, last step terminated,
    truncated, truncation_reason, meta episode_truncated, meta truncation_reason), and the
    actions the env saw."""

    replies: tuple[str, ...]
    rules: tuple[TerminationRule, ...]
    record: tuple[object, ...]
    seen: tuple[str, ...]
    env: Callable[[], TapeEnv] = TapeEnv
    parser: bool = False
    tools: bool = False
    extra: dict[str, object] = field(default_factory=dict)


CASES = {
    "max_steps": Case(
        ("go",),
        (MaxSteps(max_steps=3),),
        ("max_steps", "3 steps", False, True, "max_steps", True, "max_steps"),
        ("go",) * 3,
    ),
    "max_steps_default_bound": Case(
        ("go",),
        (),
        ("max_steps", "2 steps", False, True, "max_steps", True, "max_steps"),
        ("go",) * 2,
        extra={"max_steps": 2},
    ),
    "terminate_action": Case(
        ("go", " TERMINATE "),
        (TerminateAction(), MaxSteps(max_steps=9)),
        ("terminate_action", "TERMINATE", True, False, None, None, None),
        ("go",),
    ),
    "output_regex_after_env": Case(
        ("thinking", "FINAL: 42"),
        (OutputRegex(pattern=r"FINAL: \d+"), MaxSteps(max_steps=9)),
        ("output_regex", "FINAL: 42", True, False, None, None, None),
        ("thinking", "FINAL: 42"),
    ),
    "output_regex_before_env": Case(
        ("<move>1</move>", "<move>2</move> I give up"),
        (OutputRegex(pattern="give up", before_env=True), MaxSteps(max_steps=9)),
        ("output_regex", "give up", True, False, None, None, None),
        ("1",),
        parser=True,
    ),
    "critical_error_from_env": Case(
        ("go",),
        (CriticalError(), MaxSteps(max_steps=9)),
        ("critical_error", "disk on fire", True, False, None, None, None),
        ("go", "go"),
        env=lambda: TapeEnv(critical_at=2),
    ),
    "critical_error_parse_errors": Case(
        ("<move>1</move>", "junk", "junk", "junk"),
        (CriticalError(max_consecutive_parse_errors=2), MaxSteps(max_steps=9)),
        ("critical_error", "2 parse errors in a row", True, False, None, None, None),
        ("1",),
        parser=True,
    ),
    "critical_error_tool": Case(
        (TOOL_CALL, "go"),
        (CriticalError(fatal_tool_errors=True), MaxSteps(max_steps=9)),
        ("critical_error", "Error: RuntimeError: no", True, False, None, None, None),
        (),
        tools=True,
    ),
    "context_budget": Case(
        ("go",),
        # Byte-level ids: turns 1 and 2 fit in 70 tokens, turn 3's prompt + "go" is 83.
        (ContextBudget(max_tokens=70), MaxSteps(max_steps=9)),
        ("context_budget", "83 tokens > 70", False, True, "max_seq_len", True, "max_seq_len"),
        ("go", "go"),
    ),
    "env_terminated": Case(
        ("go",),
        (MaxSteps(max_steps=9),),
        ("env_terminated", "", True, False, None, None, None),
        ("go", "go"),
        env=lambda: TapeEnv(end_at=2),
    ),
    "parse_failure_on_a_one_reply_env": Case(
        ("junk", "<move>1</move>"),
        (MaxSteps(max_steps=9),),
        (
            "parse_error",
            "agent_0's reply did not parse; OneReplyTapeEnv takes one reply",
            True,
            False,
            None,
            None,
            None,
        ),
        (),
        env=OneReplyTapeEnv,
        parser=True,
    ),
    "env_truncated": Case(
        ("go",),
        (),
        ("env_truncated", "", False, True, "env", True, "env"),
        ("go",),
        env=lambda: TapeEnv(end_at=1, truncate=True),
    ),
    # Gymnasium's reading: a terminal state, not a cut-off (it was recorded as env_truncated)
    "env_terminated_and_truncated": Case(
        ("go",),
        (),
        ("env_terminated", "", True, False, None, None, None),
        ("go",),
        env=BothFlagsTapeEnv,
    ),
}

PROTOCOLS = ("single", "multi", "delegating")


def make_agent(case: Case) -> Agent:
    client = ScriptedClient(list(case.replies))
    kwargs = {"parser": MOVE} if case.parser else {}
    if case.tools:
        return ToolAgent(client, tools=[boom], **kwargs)
    return Agent(client, **kwargs)


def make_protocol(kind: str, case: Case) -> InteractionProtocol:
    agent = make_agent(case)
    kwargs: dict = {"termination": list(case.rules), **case.extra}
    if kind == "single":
        return SingleAgentProtocol(agent, **kwargs)
    if kind == "multi":
        return MultiAgentProtocol({"agent_0": agent}, **kwargs)
    registry = {"default": SubAgentSpec(agent_factory=lambda: Agent(ScriptedClient(["x"])))}
    return DelegatingProtocol(agent, registry, **kwargs)


def record(rollout: Rollout) -> tuple[object, ...]:
    last = rollout.env_steps[-1]
    if rollout.meta["termination_reason"].startswith("env_"):
        # The env's own step already says it ended the episode: left as the env wrote it.
        assert not {"termination_reason", "truncation_reason"} & set(last.info)
    else:
        assert last.info["termination_reason"] == rollout.meta["termination_reason"]
        assert last.info["termination_detail"] == rollout.meta["termination_detail"]
        assert last.info.get("truncation_reason") == rollout.meta.get("truncation_reason")
    return (
        rollout.meta["termination_reason"],
        rollout.meta["termination_detail"],
        last.terminated,
        last.truncated,
        last.truncation_reason,
        rollout.meta.get("episode_truncated"),
        rollout.meta.get("truncation_reason"),
    )


@pytest.mark.parametrize("kind", PROTOCOLS)
@pytest.mark.parametrize("name", CASES)
async def test_every_rule_ends_every_protocol_and_is_recorded_identically(
    kind: str, name: str
) -> None:
    case = CASES[name]
    env = case.env()
    rollouts = await make_protocol(kind, case).run(env, env_seed=0)
    (rollout,) = rollouts
    assert tuple(env.seen) == case.seen
    assert record(rollout) == case.record
    assert not rollout.failed
    # Only the last env step carries the end of the episode.
    assert not any(s.truncated or "termination_reason" in s.info for s in rollout.env_steps[:-1])
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))) == rollout


async def test_the_three_protocols_give_the_same_timeline_for_the_same_episode() -> None:
    case = CASES["critical_error_parse_errors"]
    timelines = []
    for kind in PROTOCOLS:
        (rollout,) = await make_protocol(kind, case).run(case.env(), env_seed=0)
        timelines.append(
            [
                (s.action, s.next_obs, s.terminated, s.truncated, s.truncation_reason, s.info)
                for s in rollout.env_steps
            ]
        )
    assert timelines[0] == timelines[1] == timelines[2]
    assert [step[0] for step in timelines[0]] == ["1", None, None]


async def test_a_one_reply_env_records_a_parse_failure_alike_in_every_protocol() -> None:
    """The failing step, the rollout meta and eval's episode record are the same whichever
    protocol ran the episode: one parse failure, the parser's penalty, the episode ended."""
    case = CASES["parse_failure_on_a_one_reply_env"]
    seen = []
    for kind in PROTOCOLS:
        (rollout,) = await make_protocol(kind, case).run(case.env(), env_seed=0)
        (step,) = rollout.env_steps
        (call,) = rollout.agent_steps
        record = episode_record(rollout)
        seen.append(
            (
                step.info,
                step.reward,
                call.reward,
                rollout.total_reward,
                {k: v for k, v in rollout.meta.items() if k.startswith("termination")},
                (record.num_parse_errors, record.terminated, record.success, record.outcome),
            )
        )
    assert seen[0] == seen[1] == seen[2]
    info, _, _, total, _, (parse_errors, terminated, _, _) = seen[0]
    assert info["parse_error"] and info["termination_reason"] == "parse_error"
    assert total == -1.0 and parse_errors == 1 and terminated


@pytest.mark.parametrize("kind", PROTOCOLS)
async def test_a_reply_a_rule_stops_before_the_env_is_still_a_parse_failure(kind: str) -> None:
    """An act-phase rule closing a turn whose reply did not parse keeps the parse failure on
    the step, so eval's per-episode count agrees with its per-turn record."""
    rules = (OutputRegex(pattern="give up", before_env=True),)
    case = Case(("no move, I give up",), rules, (), (), parser=True)
    env = TapeEnv()
    (rollout,) = await make_protocol(kind, case).run(env, env_seed=0)
    (step,) = rollout.env_steps
    assert env.seen == [] and step.action is None
    assert step.info["parse_error"] is True and step.info["synthetic"] is True
    assert rollout.meta["termination_reason"] == "output_regex"
    (turn,) = step_records(rollout)
    assert turn.parse_error and episode_record(rollout).num_parse_errors == 1


@pytest.mark.parametrize("kind", PROTOCOLS)
def test_max_steps_and_rules_are_checked_when_the_protocol_is_built(kind: str) -> None:
    case = Case(("go",), (), (), ())
    with pytest.raises(ValueError, match="max_steps=5 and a MaxSteps rule with max_steps=3"):
        make_protocol(kind, Case(("go",), (MaxSteps(max_steps=3),), (), (), extra={"max_steps": 5}))
    agreeing = Case(("go",), (MaxSteps(max_steps=3),), (), (), extra={"max_steps": 3})
    assert make_protocol(kind, agreeing).max_steps == 3  # type: ignore[attr-defined]
    ruled = Case(("go",), (MaxSteps(max_steps=7), MaxSteps(max_steps=4)), (), ())
    assert make_protocol(kind, ruled).max_steps == 4  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="check"):
        make_protocol(kind, Case(("go",), ("terminate",), (), ()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 1"):
        make_protocol(kind, Case(("go",), (), (), (), extra={"max_steps": 0}))
    defaults = {"single": 20, "multi": 50, "delegating": 20}
    assert make_protocol(kind, case).max_steps == defaults[kind]  # type: ignore[attr-defined]


async def test_a_rule_for_one_seat_ends_the_episode_for_every_seat() -> None:
    # Simultaneous moves: b says "terminate" while a's valid move waits; the env never steps.
    env = RockPaperScissorsEnv()
    a = Agent(ScriptedClient(["<move>rock</move>"]), parser=MOVE)
    b = Agent(ScriptedClient(["<move>terminate</move>"]), parser=MOVE)
    protocol = MultiAgentProtocol({"a": a, "b": b}, termination=[TerminateAction()])
    rollouts = {r.agent_id: r for r in await protocol.run(env, env_seed=0)}
    assert env.steps == []
    ra, rb = rollouts["a"], rollouts["b"]
    for r in (ra, rb):
        assert (r.meta["termination_reason"], r.meta["termination_detail"]) == (
            "terminate_action",
            "terminate",
        )
        (last,) = r.env_steps
        assert last.terminated and not last.truncated and last.next_obs is None
        assert last.info["termination_reason"] == "terminate_action"
    assert rb.env_steps[0].info["synthetic"] is True and rb.env_steps[0].action == "terminate"
    assert ra.env_steps[0].info["action_not_executed"] is True and ra.env_steps[0].action == "rock"


async def test_an_env_phase_rule_in_a_turn_based_game_ends_the_observer_too() -> None:
    # 3 coins: first takes 1 and its raw output matches; second only observed that move.
    env = CoinDuelEnv(coins=3)
    first = Agent(ScriptedClient(["<move>1</move> checkmate"]), parser=MOVE)
    second = Agent(ScriptedClient(["<move>1</move>"]), parser=MOVE)
    rules = [OutputRegex(pattern="checkmate"), MaxSteps(max_steps=9)]
    protocol = MultiAgentProtocol({"first": first, "second": second}, termination=rules)
    rollouts = {r.agent_id: r for r in await protocol.run(env, env_seed=0)}
    assert env.steps == [{"first": "1"}]
    f, s = rollouts["first"], rollouts["second"]
    assert f.env_steps[-1].reward == 0.0 and f.env_steps[-1].action == "1"
    assert s.env_steps[-1].info["observed"] is True and s.agent_steps == []
    for r in (f, s):
        assert r.meta["termination_reason"] == "output_regex"
        assert r.meta["termination_detail"] == "checkmate"
        assert r.env_steps[-1].terminated and not r.env_steps[-1].truncated


async def test_a_seat_finished_by_the_env_keeps_its_own_reason() -> None:
    # The env ends both seats on the last coin: each is recorded as env_terminated once.
    env = CoinDuelEnv(coins=2)
    first = Agent(ScriptedClient(["<move>2</move>"]), parser=MOVE)
    second = Agent(ScriptedClient(["<move>1</move>"]), parser=MOVE)
    protocol = MultiAgentProtocol({"first": first, "second": second}, max_steps=4)
    for r in await protocol.run(env, env_seed=0):
        assert r.meta["termination_reason"] == "env_terminated"
        assert "episode_truncated" not in r.meta
        assert "termination_reason" not in r.env_steps[-1].info and r.env_steps[-1].terminated


async def test_a_sub_agent_follows_its_spec_rules_not_the_parents() -> None:
    call = '<tool_call>{"name": "delegate", "arguments": {"task": "t"}}</tool_call>'
    boss = ToolAgent(
        ScriptedClient([call, "<move>x</move>"]), external_tools=[delegate], parser=MOVE
    )

    def helper() -> Agent:
        return Agent(ScriptedClient(["<move>x</move> STOP"]), parser=MOVE)

    spec = SubAgentSpec(
        agent_factory=helper,
        env_factory=lambda task: TaskEnv(task),
        termination=[OutputRegex(pattern="STOP", before_env=True)],
    )
    parent_rules = [TerminateAction(actions=("x",))]
    env = TapeEnv()
    protocol = DelegatingProtocol(boss, {"default": spec}, termination=parent_rules)
    parent, child = await protocol.run(env, env_seed=0)
    # The child's own rule ends it (the parent's rule would have said terminate_action).
    assert child.meta["termination_reason"] == "output_regex"
    assert child.env_steps[-1].info["synthetic"] is True  # the task env never saw "x"
    assert child.meta["parent_rollout_id"] == parent.id
    assert parent.meta["termination_reason"] == "terminate_action" and env.seen == []
    with pytest.raises(ValueError, match="SubAgentSpec"):
        SubAgentSpec(agent_factory=helper, max_steps=2, termination=[MaxSteps(max_steps=3)])
