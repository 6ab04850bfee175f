"""Snapshots and drift splits end to end on the tiny model: context-editing and ReAct agents on
the corridor task, the tiny tokenizer's chat template, `generate_batch` with every snapshot
policy. Every sample must be an exact sequence the model saw: its behaviour logprobs equal the
tiny model's logprobs recomputed on the sample, action token by action token.

`TinyPolicy` plays scripted replies through the real template and model (teacher forcing), so
edits and drift happen where the test puts them; the last test lets the embedded engine
sample freely."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from ludic.agents import ReActAgent
from ludic.agents.context_editing import ContextEditingAgent, snapshot_tokens
from ludic.context.editing import EditableContext
from ludic.envs.long_task import MemoryCorridorEnv, context_length_penalty
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.embedded.engine import EmbeddedEngine
from ludic.inference.embedded.prompts import render_prompt_ids
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.models import TinyModelSpec, build_tiny_model
from ludic.rollouts import (
    ComponentSpec,
    RolloutEngine,
    RolloutRequest,
    SAWItem,
    generate_batch,
)
from ludic.training.credit import GroupNormalizedReturn
from ludic.types import AgentStep

# The tiny tokenizer and chat template, on a smaller network: the prompts here are long and
# the test recomputes every sample's logprobs.
SPEC = TinyModelSpec(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4
)
MODEL, TOKENIZER = build_tiny_model(seed=0, spec=SPEC)
IM_END = TOKENIZER.convert_tokens_to_ids("<|im_end|>")
ENV = {"length": 3, "filler_words": 3}


def _code() -> str:
    env = MemoryCorridorEnv(**ENV)
    env.env_reset(seed=1)
    return env.code


CODE = _code()


_LOGPROBS: dict[tuple[int, ...], list[float]] = {}


@torch.inference_mode()
def model_logprobs(ids: tuple[int, ...]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 under the tiny model, temperature 1 (memoised: the
    parametrised runs replay the same episodes)."""
    if ids not in _LOGPROBS:
        _LOGPROBS[ids] = _forward(ids)
    return _LOGPROBS[ids]


def _forward(ids: tuple[int, ...]) -> list[float]:
    ids_1T = torch.tensor([ids])
    logits_TV = MODEL(input_ids=ids_1T).logits[0, :-1].float()
    return torch.log_softmax(logits_TV, -1).gather(-1, ids_1T[0, 1:, None]).squeeze(-1).tolist()


class TinyPolicy:
    """A ChatClient that plays `replies` through the tiny model: prompt ids from the chat
    template (as the embedded engine renders them), the reply's ids + <|im_end|>, and the
    model's own logprobs of those ids (as if it had sampled them at temperature 1)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        text = self.replies.pop(0)
        prompt = render_prompt_ids(TOKENIZER, request.messages, request.tools)
        completion = [*TOKENIZER.encode(text, add_special_tokens=False), IM_END]
        logprobs = model_logprobs(tuple(prompt + completion))[len(prompt) - 1 :]
        return ChatResponse(
            text=text,
            prompt_token_ids=tuple(prompt),
            completion_token_ids=tuple(completion),
            completion_logprobs=tuple(logprobs),
            finish_reason="stop",
            policy_version=0,
        )


def note(text: str) -> str:
    """Write a note (an internal tool that edits nothing).

    Args:
        text: what to note
    """
    return "noted"


def taught(name: str, **arguments: Any) -> str:
    """A tool call in the form the agents' instructions teach (the template's own form)."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def compact(name: str, **arguments: Any) -> str:
    """The one-line form the template re-renders with newlines: template drift."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


BUDGET = 200


def penalty(step: AgentStep) -> float:
    return context_length_penalty(snapshot_tokens(step), budget_tokens=BUDGET)


# plan -> (edits, drift splits). Message #1 is room 1's observation.
PLANS = {
    "plain": (["next", "next", f"answer {CODE}"], 0, 0),
    "taught_edit": (
        ["next", taught("delete_context", message_ids=[1]), "next", f"answer {CODE}"],
        1,
        0,
    ),
    "compact_note": (["next", compact("note", text="code?"), "next", f"answer {CODE}"], 0, 1),
    "drift_then_edit": (
        [
            "next",
            compact("note", text="code?"),
            taught("delete_context", message_ids=[1]),
            "next",
            compact("note", text="exit"),
            "answer 0",
        ],
        1,
        2,
    ),
    "taught_note": (["next", taught("note", text="code?"), "next", f"answer {CODE}"], 0, 0),
}


def editing_protocol(plan: str) -> SingleAgentProtocol:
    agent = ContextEditingAgent(
        TinyPolicy(PLANS[plan][0]),
        context=EditableContext(),
        tools=[note],
        snapshot_reward=penalty,
    )
    return SingleAgentProtocol(agent, max_steps=8)


ENGINE = RolloutEngine(
    env_registry={"corridor": lambda **kw: MemoryCorridorEnv(**kw)},
    protocol_registry={"editing": editing_protocol},
)


def requests() -> list[RolloutRequest]:
    return [
        RolloutRequest(
            env=ComponentSpec(name="corridor", kwargs=ENV),
            protocol=ComponentSpec(name="editing", kwargs={"plan": plan}),
            env_seed=1,
            group_id="g",
        )
        for plan in PLANS
    ]


def assert_exact(sample: SAWItem) -> None:
    """The sample's action tokens carry the logprobs the model gives them in this sequence."""
    assert sample.behavior_logprobs is not None
    recomputed = model_logprobs(sample.input_ids)
    for t, (mask, lp) in enumerate(zip(sample.action_mask, sample.behavior_logprobs, strict=True)):
        if mask:
            assert t > 0 and lp == pytest.approx(recomputed[t - 1], abs=1e-4), t


@pytest.mark.parametrize("mode", ["turn", "episode"])
@pytest.mark.parametrize("policy", ["share", "split", "own_reward"])
async def test_edits_make_snapshots_and_drift_makes_exact_splits(mode: str, policy: str) -> None:
    batch = await generate_batch(
        ENGINE,
        requests(),
        GroupNormalizedReturn(),
        sample_mode=mode,  # type: ignore[arg-type]
        snapshot_policy=policy,  # type: ignore[arg-type]
    )
    assert batch.stats.num_failed == 0 and batch.stats.num_build_failed == 0
    assert batch.stats.num_snapshots == sum(p[1] for p in PLANS.values()) == 2
    assert batch.stats.num_drift_splits == sum(p[2] for p in PLANS.values()) == 3
    for sample in batch.samples:
        assert_exact(sample)
    by_plan = {
        plan: [s for s in batch.samples if s.meta["rollout_id"] == rollout.id]
        for plan, rollout in zip(PLANS, batch.rollouts, strict=True)
    }
    # The taught tool call keeps a tool loop in one sequence: as many samples as no tool call.
    assert len(by_plan["taught_note"]) == len(by_plan["plain"])
    # drift_then_edit: next | note (drift) | delete (edit) | next | note (drift) | answer.
    # Turn 1 is [note | delete | next]; the episode is [next+note | delete | next+note | answer].
    # A drift piece belongs to its segment and takes its weight and reward.
    if mode == "turn":
        pieces = [s for s in by_plan["drift_then_edit"] if s.meta["turn_index"] == 1]
        expected = [(0, 0, True, False), (0, 1, False, True), (1, 0, False, False)]
    else:
        pieces = by_plan["drift_then_edit"]
        expected = [
            (0, 0, True, False),
            (0, 1, False, True),
            (1, 0, True, False),
            (1, 1, False, False),
        ]
    got = [
        (
            s.meta["segment_index"],
            s.meta["piece_index"],
            s.meta["drift_split"],
            s.meta["is_snapshot"],
        )
        for s in pieces
    ]
    assert got == expected
    assert (
        pieces[0].weight == pieces[1].weight
        and pieces[0].meta["reward"] == pieces[1].meta["reward"]
    )
    if policy == "own_reward":
        rollout = batch.rollouts[list(PLANS).index("drift_then_edit")]
        (edit_step,) = [s for s in rollout.agent_steps if "context_edits" in s.info]
        assert pieces[0].meta["reward"] == edit_step.info["snapshot_reward"] == pieces[1].weight
        assert pieces[2].meta["weight_source"] == "credit"


@pytest.mark.slow
async def test_free_sampling_on_the_embedded_engine_builds_exact_samples() -> None:
    """The random tiny model writes whatever it writes (sometimes tool-call tags): whatever
    the splits, own_reward never aborts, and every sample is exact."""
    engine = EmbeddedEngine(MODEL, TOKENIZER)
    try:
        sampling = SamplingConfig(max_tokens=24, seed=3)

        def protocol(kind: str) -> SingleAgentProtocol:
            agent: Any
            if kind == "react":
                agent = ReActAgent(engine, tools=[note], sampling=sampling, max_inner_steps=3)
            else:
                agent = ContextEditingAgent(engine, sampling=sampling, max_inner_steps=3)
            return SingleAgentProtocol(agent, max_steps=3)

        rollouts = RolloutEngine(
            env_registry={"corridor": lambda **kw: MemoryCorridorEnv(**kw)},
            protocol_registry={"p": protocol},
        )
        reqs = [
            RolloutRequest(
                env=ComponentSpec(name="corridor", kwargs=ENV),
                protocol=ComponentSpec(name="p", kwargs={"kind": kind}),
                env_seed=1,
                sampling_seed=seed,
                group_id=kind,
            )
            for kind in ("react", "editing")
            for seed in (1, 2)
        ]
        batch = await generate_batch(
            rollouts,
            reqs,
            GroupNormalizedReturn(),
            sample_mode="episode",
            snapshot_policy="own_reward",
        )
    finally:
        engine.close()
    # Its byte soup rarely survives decode + re-render, so drift splits are common here.
    stats = batch.stats
    assert stats.num_failed == 0 and stats.num_build_failed == 0 and batch.samples
    # Episode mode: one sample per rollout, plus one per cut (edit or drift).
    assert len(batch.samples) == len(batch.rollouts) + stats.num_snapshots + stats.num_drift_splits
    edits = sum(1 for r in batch.rollouts for s in r.agent_steps if s.info.get("context_edits"))
    assert stats.num_snapshots <= edits
    for sample in batch.samples:
        assert_exact(sample)
