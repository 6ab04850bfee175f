"""Delegation credit: children keep their own identity and group, and hierarchical assigners
pass the parent's credit down (inherit / own / mix), on rollouts from a real RolloutEngine run
of DelegatingProtocol."""

from __future__ import annotations

import asyncio
import math
import sys
from pathlib import Path

import pytest

from ludic.agents import Agent, ToolAgent
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import DelegatingProtocol, SubAgentSpec, TaskEnv, delegate
from ludic.parsers import xml_tag_parser
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest
from ludic.training.credit import (
    GiGPO,
    GroupNormalizedReturn,
    HierarchicalCredit,
    hierarchical_weights,
    rollout_group_key,
)
from ludic.types import Rollout

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interaction"))
from interaction_fakes import CountingEnv

MOVE = xml_tag_parser("move")
CALL = '<tool_call>{"name": "delegate", "arguments": {"task": "say ok", "agent": "helper"}}'
CALL += "</tool_call>"
# Hand derivation: parents rewarded [1, 1, 0, 0] form one group: mean 0.5, sample std
# sqrt(4 * 0.25 / 3) = 0.57735, so A = +-0.5 / 0.57735 = +-0.866025 (eps 1e-6 aside).
# Children (all rewarded 1) form their own group: every value equal, A = 0.
# Mixing them into the parents' group, as before, gave [1,1,0,0,1,1,1,1]: mean 0.75,
# std 0.46291, parents +0.540 / -1.620 and children +0.540.
PARENT_A = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)


def boss(answer: str) -> DelegatingProtocol:
    agent = ToolAgent(
        ScriptedClient([CALL, f"<move>{answer}</move>"]), external_tools=[delegate], parser=MOVE
    )
    helper = SubAgentSpec(
        agent_factory=lambda: Agent(ScriptedClient(["<move>ok</move>"]), parser=MOVE),
        env_factory=lambda task: TaskEnv(task, judge=lambda t, a: 1.0 if a == "ok" else 0.0),
    )
    return DelegatingProtocol(agent, {"helper": helper})


def run_group(answers: list[str]) -> list[Rollout]:
    engine = RolloutEngine(
        env_registry={"count": lambda: CountingEnv(length=1)},
        protocol_registry={"boss": boss},
    )
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="count"),
            protocol=ComponentSpec(name="boss", kwargs={"answer": a}),
            env_seed=7,
            group_id="g0",
        )
        for a in answers
    ]
    return asyncio.run(engine.run(requests))


def split(rollouts: list[Rollout]) -> tuple[list[Rollout], list[Rollout]]:
    parents = [r for r in rollouts if "parent_rollout_id" not in r.meta]
    children = [r for r in rollouts if "parent_rollout_id" in r.meta]
    return parents, children


def episode_weight(weights: dict[tuple[str, str], float], rollout: Rollout) -> float:
    (value,) = {weights[(rollout.id, t.turn_id)] for t in rollout.turns()}
    return value


@pytest.fixture(scope="module")
def rollouts() -> list[Rollout]:
    return run_group(["good", "good", "bad", "bad"])


def test_children_keep_their_own_identity_and_group(rollouts: list[Rollout]) -> None:
    parents, children = split(rollouts)
    assert len(parents) == 4 and len(children) == 4
    assert {p.agent_id for p in parents} == {"agent_0"}
    # The sub-agent's id equalled its parent's, so it is named after its registry entry, in
    # the rollout and in every step; the parent's group id is still stamped (the link).
    assert {c.agent_id for c in children} == {"helper"}
    assert all(s.agent_id == "helper" for c in children for s in c.steps)
    assert {c.group_id for c in children} == {"g0"}
    parent_keys = {rollout_group_key(p, p.turns()) for p in parents}
    child_keys = {rollout_group_key(c, c.turns()) for c in children}
    assert len(parent_keys) == 1 and len(child_keys) == 1 and parent_keys != child_keys
    by_id = {p.id: p for p in parents}
    for child in children:
        assert by_id[child.meta["parent_rollout_id"]].meta["child_rollout_ids"] == [child.id]


def test_grpo_and_gigpo_give_the_issues_numbers(rollouts: list[Rollout]) -> None:
    parents, children = split(rollouts)
    for credit in (GroupNormalizedReturn(), GiGPO(omega=0.0)):
        weights = credit.assign(rollouts)
        for parent in parents:
            expected = PARENT_A if parent.total_reward == 1.0 else -PARENT_A
            assert episode_weight(weights, parent) == pytest.approx(expected, abs=1e-9)
        for child in children:
            assert child.total_reward == 1.0
            assert episode_weight(weights, child) == 0.0


@pytest.mark.parametrize(("mode", "share"), [("inherit", 1.0), ("own", 0.0), ("mix", 0.25)])
def test_hierarchical_modes(rollouts: list[Rollout], mode: str, share: float) -> None:
    parents, children = split(rollouts)
    credit = HierarchicalCredit(mode=mode, mix=0.25)  # type: ignore[arg-type]
    weights = credit.assign(rollouts)
    by_id = {p.id: p for p in parents}
    for parent in parents:  # parents keep their own group advantage
        expected = PARENT_A if parent.total_reward == 1.0 else -PARENT_A
        assert episode_weight(weights, parent) == pytest.approx(expected, abs=1e-9)
    for child in children:
        parent = by_id[child.meta["parent_rollout_id"]]
        # own child advantage is 0 (equal rewards): w = share * A_parent + (1 - share) * 0
        expected = share * (PARENT_A if parent.total_reward == 1.0 else -PARENT_A)
        assert episode_weight(weights, child) == pytest.approx(expected, abs=1e-9)


def test_mix_weights_by_hand_and_grandchildren_inherit_through_their_parent() -> None:
    from ludic.types import AgentStep, EnvironmentStep

    def rollout(rid: str, turn: str, **meta: object) -> Rollout:
        a = AgentStep(turn_id=turn, info={"observation": rid})
        e = EnvironmentStep(turn_id=turn, reward=1.0, agent_step_ids=(a.id,))
        return Rollout(id=rid, steps=[a, e], meta=dict(meta))

    top = rollout("p", "tp")
    child = rollout("c", "tc", parent_rollout_id="p", parent_turn_id="tp", delegation_depth=1)
    grand = rollout("g", "tg", parent_rollout_id="c", parent_turn_id="tc", delegation_depth=2)
    own = {("p", "tp"): 2.0, ("c", "tc"): 1.0, ("g", "tg"): -1.0}
    # mix 0.5: c = 0.5 * 2 + 0.5 * 1 = 1.5; g = 0.5 * 1.5 + 0.5 * (-1) = 0.25 (order-free)
    for batch in ([grand, child, top], [top, child, grand]):
        out = hierarchical_weights(batch, own, mode="mix", mix=0.5)
        assert out == {("p", "tp"): 2.0, ("c", "tc"): 1.5, ("g", "tg"): 0.25}
    with pytest.raises(ValueError, match="not in the batch"):
        hierarchical_weights([child], {("c", "tc"): 1.0}, mode="inherit")
    assert hierarchical_weights([child], {("c", "tc"): 1.0}, mode="own") == {("c", "tc"): 1.0}
    with pytest.raises(ValueError, match="mode must be one of"):
        HierarchicalCredit(mode="up")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mix must be in"):
        HierarchicalCredit(mix=1.5)


def test_a_named_sub_agent_keeps_its_own_id() -> None:
    agent = ToolAgent(
        ScriptedClient([CALL, "<move>good</move>"]), external_tools=[delegate], parser=MOVE
    )
    helper = SubAgentSpec(
        agent_factory=lambda: Agent(
            ScriptedClient(["<move>ok</move>"]), parser=MOVE, agent_id="researcher"
        )
    )
    parent, child = asyncio.run(
        DelegatingProtocol(agent, {"helper": helper}).run(CountingEnv(length=1))
    )
    assert parent.agent_id == "agent_0" and child.agent_id == "researcher"
    assert {s.agent_id for s in child.steps} == {"researcher"}
