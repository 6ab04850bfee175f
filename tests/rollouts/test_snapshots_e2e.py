"""Seed 002's test cases end to end: a context-editing agent on the corridor task, run by the
RolloutEngine, turned into samples. Every edit closes a snapshot; the final trajectory follows.

Corridor of 3 rooms (env seed 1). Message ids in the agent's history for plan TWO_EDITS:
#0 system, #1 room 1, #2 next, #3 room 2, #4 delete call [1], #5 its result, #6 next,
#7 exit, #8 delete call [3] (removes #3-#6: room 2 and the whole reply to it), #9 result,
#10 answer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ludic.agents import Agent
from ludic.agents.context_editing import ContextEditingAgent, snapshot_tokens
from ludic.context.editing import EditableContext
from ludic.envs.long_task import MemoryCorridorEnv, context_length_penalty
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient, hermes_tool_call
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import (
    ComponentSpec,
    RolloutEngine,
    RolloutRequest,
    build_samples,
    generate_batch,
)
from ludic.training.credit import GroupNormalizedReturn
from ludic.types import AgentStep, Rollout

ENV = {"length": 3, "filler_words": 3}
BUDGET = 400


def _code() -> str:
    env = MemoryCorridorEnv(**ENV)
    env.env_reset(seed=1)
    return env.code


CODE = _code()


def delete(*ids: int) -> str:
    args = {"name": "delete_context", "arguments": {"message_ids": list(ids)}}
    return hermes_tool_call(args)  # the form the chat template renders back: append-only


NO_EDITS = ["next", "next", f"answer {CODE}"]
ONE_EDIT = ["next", delete(1), "next", f"answer {CODE}"]
TWO_EDITS = ["next", delete(1), "next", delete(3), f"answer {CODE}"]
TWO_EDITS_WRONG = ["next", delete(1), "next", delete(3), "answer x"]


def penalty(step: AgentStep) -> float:
    return context_length_penalty(snapshot_tokens(step), budget_tokens=BUDGET)


class EmptyCompletionAt:
    """Scripted replies, but call `index` comes back with no completion tokens (a backend
    that returned only parsed text): its segment has nothing to train on."""

    def __init__(self, replies: list[str], index: int) -> None:
        self.inner = ScriptedClient(replies)
        self.index = index

    async def complete(self, request: ChatRequest) -> ChatResponse:
        response = await self.inner.complete(request)
        if self.inner.calls - 1 != self.index:
            return response
        return dataclasses.replace(response, completion_token_ids=(), completion_logprobs=())


def make_protocol(
    plan: list[str],
    editing: bool = True,
    show_ids: bool = True,
    version: int = 0,
    empty_at: int | None = None,
) -> SingleAgentProtocol:
    client: Any = ScriptedClient(plan, policy_version=version)
    if empty_at is not None:
        client = EmptyCompletionAt(plan, empty_at)
    agent: Agent
    if editing:
        context = EditableContext(show_ids=show_ids)
        agent = ContextEditingAgent(
            client, context=context, instructions=None, snapshot_reward=penalty
        )
    else:
        agent = Agent(client)
    return SingleAgentProtocol(agent, max_steps=8)


ENGINE = RolloutEngine(
    env_registry={"corridor": lambda **kw: MemoryCorridorEnv(**kw)},
    protocol_registry={"editing": make_protocol},
)


def request(group: str = "g", **protocol_kwargs: Any) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="corridor", kwargs=ENV),
        protocol=ComponentSpec(name="editing", kwargs=protocol_kwargs),
        env_seed=1,
        group_id=group,
    )


async def run(*requests: RolloutRequest) -> list[Rollout]:
    rollouts = await ENGINE.run(list(requests))
    assert not any(r.failed for r in rollouts), [r.meta for r in rollouts]
    return rollouts


def ones(rollouts: list[Rollout], value: float = 1.0) -> dict[tuple[str, str], float]:
    return {(r.id, t.turn_id): value for r in rollouts for t in r.turns()}


def sequence(step: AgentStep) -> tuple[int, ...]:
    assert step.trace is not None
    return step.trace.prompt_token_ids + step.trace.completion_token_ids


async def test_single_trajectory_is_backward_compatible() -> None:
    plain, editing = await run(
        request(plan=NO_EDITS, editing=False), request(plan=NO_EDITS, show_ids=False)
    )
    for mode in ("episode", "turn"):
        a = build_samples([plain], ones([plain]), mode=mode)  # type: ignore[arg-type]
        b = build_samples([editing], ones([editing]), mode=mode)  # type: ignore[arg-type]
        assert len(a) == (1 if mode == "episode" else 3)
        assert [(s.input_ids, s.action_mask, s.behavior_logprobs, s.weight) for s in a] == [
            (s.input_ids, s.action_mask, s.behavior_logprobs, s.weight) for s in b
        ]
        assert all(not s.meta["is_snapshot"] and s.meta["num_segments"] == 1 for s in b)
    (tagged,) = await run(request(plan=NO_EDITS))  # ids shown: still one trajectory
    (sample,) = build_samples([tagged], ones([tagged]), mode="episode")
    assert not sample.meta["is_snapshot"] and sample.meta["reward"] == 1.0


async def test_snapshots_carry_the_right_data_and_the_final_trajectory_is_included() -> None:
    (rollout,) = await run(request(plan=TWO_EDITS))
    calls = rollout.agent_steps
    assert [c.completion for c in calls] == TWO_EDITS
    samples = build_samples([rollout], ones([rollout], 0.5), mode="episode")
    assert [s.meta["is_snapshot"] for s in samples] == [True, True, False]
    assert [s.meta["segment_index"] for s in samples] == [0, 1, 2]
    # Snapshot k is the whole sequence up to and including the call that made edit k.
    assert samples[0].input_ids == sequence(calls[1])
    assert samples[1].input_ids == sequence(calls[3])
    assert samples[2].input_ids == sequence(calls[4])  # the final trajectory: the answer
    assert samples[1].input_ids[: len(sequence(calls[2]))] == sequence(calls[2])
    # Action tokens: exactly the completions of the calls in each segment.
    traces = [c.trace for c in calls]
    assert all(t is not None and t.completion_logprobs is not None for t in traces)
    for sample, seg_calls in zip(samples, ([0, 1], [2, 3], [4]), strict=True):
        seg = [traces[i] for i in seg_calls]
        assert sample.num_action_tokens == sum(len(t.completion_token_ids) for t in seg)  # type: ignore[union-attr]
        assert sample.behavior_logprobs is not None
        mask = sample.action_mask
        lp = [x for x, m in zip(sample.behavior_logprobs, mask, strict=True) if m]
        assert lp == [x for t in seg for x in t.completion_logprobs]  # type: ignore[union-attr]
    # The final prompt no longer holds room 2 but still holds the exit.
    final_prompt = [m["content"] for m in calls[4].prompt_messages]
    assert not any("Room 2 of 3" in c for c in final_prompt)
    assert any("[#7] Room 3 of 3: the exit" in c for c in final_prompt)
    for s in samples:
        assert s.meta["rollout_id"] == rollout.id and s.meta["group_id"] == "g"
        assert s.meta["num_segments"] == 3 and s.meta["reward"] == 1.0 and s.weight == 0.5
        assert s.meta["policy_versions"] == [0]
    ids = [s.meta["sample_id"] for s in samples]
    assert [s.meta["parent_sample_id"] for s in samples] == [None, *ids[:-1]]
    # The edit steps say what they removed and which snapshot they closed; each step carries
    # the history version of its prompt, which the two edits bumped.
    assert [c.info.get("snapshot_index") for c in calls] == [None, 0, None, 1, None]
    assert [c.info["context_version"] for c in calls] == [0, 0, 1, 1, 2]
    assert calls[3].info["context_edits"][0]["removed_ids"] == [3, 4, 5, 6]


async def test_turn_mode_splits_only_the_turns_that_edit() -> None:
    (rollout,) = await run(request(plan=TWO_EDITS))
    samples = build_samples([rollout], ones([rollout]), mode="turn")
    assert [(s.meta["turn_index"], s.meta["is_snapshot"]) for s in samples] == [
        (0, False),
        (1, True),
        (1, False),
        (2, True),
        (2, False),
    ]
    snap, final = samples[3], samples[4]
    assert snap.meta["turn_id"] == final.meta["turn_id"]
    assert snap.input_ids == sequence(rollout.agent_steps[3])


async def test_precomputed_and_computed_rewards_are_independent() -> None:
    win, lose = await run(request(plan=TWO_EDITS), request(plan=TWO_EDITS_WRONG))
    weights = GroupNormalizedReturn().assign([win, lose])  # computed after the rollouts
    samples = build_samples([win, lose], weights, mode="episode", snapshot_policy="own_reward")
    by = {r.id: [s for s in samples if s.meta["rollout_id"] == r.id] for r in (win, lose)}
    for rollout in (win, lose):
        snaps = by[rollout.id][:2]
        edit_steps = [rollout.agent_steps[1], rollout.agent_steps[3]]
        # Precomputed at rollout time from each snapshot's own length, whatever the outcome.
        expected = [penalty(s) for s in edit_steps]
        assert [s.weight for s in snaps] == pytest.approx(expected, abs=1e-12)
        assert [s.meta["reward"] for s in snaps] == [s.info["snapshot_reward"] for s in edit_steps]
        assert all(s.meta["weight_source"] == "snapshot_reward" for s in snaps)
    assert [s.weight for s in by[win.id][:2]] == [s.weight for s in by[lose.id][:2]]
    assert any(s.weight < 0 for s in by[win.id][:2])  # the second snapshot was over budget
    # The final trajectories carry the computed outcome credit: (1 - .5) / (std .7071) = +-0.7071.
    assert by[win.id][2].weight == pytest.approx(0.5**0.5, abs=1e-5)
    assert by[lose.id][2].weight == pytest.approx(-(0.5**0.5), abs=1e-5)
    assert (by[win.id][2].meta["reward"], by[lose.id][2].meta["reward"]) == (1.0, 0.0)


async def test_a_mixed_batch_flattens_to_the_right_size() -> None:
    requests = [request(plan=NO_EDITS), request(plan=ONE_EDIT), request(plan=TWO_EDITS)]
    episode = await generate_batch(ENGINE, requests, GroupNormalizedReturn(), sample_mode="episode")
    assert [len(r.agent_steps) for r in episode.rollouts] == [3, 4, 5]
    assert episode.stats.num_samples == len(episode.samples) == 1 + 2 + 3
    assert episode.stats.num_snapshots == 0 + 1 + 2
    order = [(s.meta["rollout_id"], s.meta["segment_index"]) for s in episode.samples]
    ids = [r.id for r in episode.rollouts]
    assert order == [(ids[0], 0), (ids[1], 0), (ids[1], 1), (ids[2], 0), (ids[2], 1), (ids[2], 2)]
    turn = await generate_batch(ENGINE, requests, GroupNormalizedReturn(), sample_mode="turn")
    assert turn.stats.num_samples == 3 + (3 + 1) + (3 + 2)
    assert turn.stats.num_snapshots == 3


async def test_deletes_at_different_positions() -> None:
    # At the very first call (only room 1 to delete: the agent walks on with an empty memory),
    # and two edits in a row inside one turn.
    first = [delete(1), "next", "next", f"answer {CODE}"]
    in_a_row = ["next", delete(1), delete(3), "next", f"answer {CODE}"]
    a, b = await run(request(plan=first), request(plan=in_a_row))
    sa = build_samples([a], ones([a]), mode="episode")
    assert [s.meta["is_snapshot"] for s in sa] == [True, False]
    assert sa[0].input_ids == sequence(a.agent_steps[0])  # the first prompt + the delete call
    sb = build_samples([b], ones([b]), mode="episode")
    assert [s.meta["is_snapshot"] for s in sb] == [True, True, False]
    assert sb[1].input_ids == sequence(b.agent_steps[2])  # the second edit alone
    assert [s.info.get("snapshot_index") for s in b.agent_steps] == [None, 0, 1, None, None]
    assert b.total_reward == a.total_reward == 1.0


async def test_an_empty_snapshot_is_handled() -> None:
    # Call 2 (the second delete, right after the first) comes back without tokens: its
    # segment is empty and dropped; indices stay contiguous and its reward goes with it.
    plan = ["next", delete(1), delete(3), "next", f"answer {CODE}"]
    (rollout,) = await run(request(plan=plan, empty_at=2))
    assert rollout.agent_steps[2].info["context_edits"]  # the edit itself happened
    samples = build_samples(
        [rollout], ones([rollout]), mode="episode", snapshot_policy="own_reward"
    )
    assert [s.meta["segment_index"] for s in samples] == [0, 1]
    assert [s.meta["is_snapshot"] for s in samples] == [True, False]
    assert samples[0].input_ids == sequence(rollout.agent_steps[1])
    assert samples[1].meta["num_segments"] == 2 and samples[1].weight == 1.0
    # A refused edit (nothing removed) is no snapshot at all.
    (refused,) = await run(request(plan=["next", delete(0), "next", "next", f"answer {CODE}"]))
    (only,) = build_samples([refused], ones([refused]), mode="episode")
    assert not only.meta["is_snapshot"] and refused.agent_steps[1].tool_results[0].is_error
