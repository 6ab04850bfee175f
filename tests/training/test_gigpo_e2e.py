"""GiGPO end to end on the corridor task: real episodes (scripted policies of two policy
versions, one that edits its context), anchor states from the env's state key, hand-derived
advantages, credit shared by snapshot segments, and one Trainer step on the samples.

Corridor of 3 rooms, env seed 0: the note with code 6 is in room 2. State keys (room, seen):
A = (1, 0) start, B = (2, 1), C = (1, 1) back in room 1 after the note, D = (3, 1) the exit.
  e1 (version 0): next, next, answer 6            states A B D      rewards 0 0 1   R = 1
  e2 (version 1): next, back, next, next, answer 6  states A B C B D  rewards 0 0 0 0 1  R = 1
  e3 (version 1): next, [delete #1, next], answer 0  states A B D    rewards 0 0 0   R = 0
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ludic.agents.context_editing import ContextEditingAgent
from ludic.envs.long_task import MemoryCorridorEnv
from ludic.inference.scripted import VOCAB_SIZE, ScriptedClient
from ludic.interaction import MaxSteps, SingleAgentProtocol
from ludic.rollouts import ComponentSpec, RolloutEngine, RolloutRequest, SAWItem, build_samples
from ludic.training import SAWBatch, Trainer, TrainerConfig, make_gigpo
from ludic.training.credit import GiGPO
from ludic.types import Rollout

ENV = {"length": 3, "filler_words": 3}
DELETE = json.dumps({"name": "delete_context", "arguments": {"message_ids": [1]}})
PLANS = {
    "e1": (["next", "next", "answer 6"], 0),
    "e2": (["next", "back", "next", "next", "answer 6"], 1),
    "e3": (["next", f"<tool_call>{DELETE}</tool_call>", "next", "answer 0"], 1),
}
A, B, C, D = "(1, 0)", "(2, 1)", "(1, 1)", "(3, 1)"


def protocol(name: str) -> SingleAgentProtocol:
    plan, version = PLANS[name]
    agent = ContextEditingAgent(ScriptedClient(plan, policy_version=version), instructions=None)
    return SingleAgentProtocol(agent, termination=[MaxSteps(max_steps=8)], rollout_id=name)


async def group() -> list[Rollout]:
    engine = RolloutEngine(
        env_registry={"corridor": lambda **kw: MemoryCorridorEnv(**kw)},
        protocol_registry={"plan": protocol},
    )
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="corridor", kwargs=ENV),
            protocol=ComponentSpec(name="plan", kwargs={"name": name}),
            env_seed=0,
            group_id="g",
        )
        for name in PLANS
    ]
    rollouts = await engine.run(requests)
    assert not any(r.failed for r in rollouts)
    return rollouts


async def test_states_repeat_across_and_within_episodes() -> None:
    rollouts = await group()
    states = {r.id: [t.state_key for t in r.turns()] for r in rollouts}
    assert states == {"e1": [A, B, D], "e2": [A, B, C, B, D], "e3": [A, B, D]}
    assert [r.total_reward for r in rollouts] == [1.0, 1.0, 0.0]
    e3_turn1 = rollouts[2].turns()[1]
    assert [s.completion.startswith("<tool_call>") for s in e3_turn1.agent_steps] == [True, False]


# gamma = 1/2, mean-only normalisation, A = A_E + A_S (paper, omega = 1):
#   A_E = R - mean(R) = [1, 1, 0] - 2/3 = [1/3, 1/3, -2/3]
#   G:  e1 [1/4, 1/2, 1]   e2 [1/16, 1/8, 1/4, 1/2, 1]   e3 [0, 0, 0]
#   A:  {e1 1/4, e2 1/16, e3 0}        mean 5/48  -> A_S = 7/48, -2/48, -5/48
#   B:  {e1 1/2, e2 1/8, e2 1/2, e3 0}  mean 9/32  -> A_S = 7/32, -5/32, 7/32, -9/32
#   C:  {e2 1/4} alone                  -> A_S = 0
#   D:  {e1 1, e2 1, e3 0}              mean 2/3   -> A_S = 1/3, 1/3, -2/3
EXPECTED = {
    "e1": [1 / 3 + 7 / 48, 1 / 3 + 7 / 32, 1 / 3 + 1 / 3],
    "e2": [1 / 3 - 2 / 48, 1 / 3 - 5 / 32, 1 / 3 + 0.0, 1 / 3 + 7 / 32, 1 / 3 + 1 / 3],
    "e3": [-2 / 3 - 5 / 48, -2 / 3 - 9 / 32, -2 / 3 - 2 / 3],
}
GIGPO = GiGPO(gamma=0.5, normalize_std=False, step_normalize_std=False)


async def test_hand_derived_advantages_over_anchor_states() -> None:
    rollouts = await group()
    details = GIGPO.details(rollouts)
    for r in rollouts:
        got = [details[(r.id, t.turn_id)].advantage for t in r.turns()]
        assert got == pytest.approx(EXPECTED[r.id], abs=1e-12)
    e2 = rollouts[1].turns()
    assert [details[("e2", t.turn_id)].anchor_group_size for t in e2] == [3, 4, 1, 4, 3]
    assert details[("e2", e2[2].turn_id)].step_advantage == 0.0  # C: no one to compare with


async def test_snapshot_segments_share_their_turns_gigpo_credit() -> None:
    rollouts = await group()
    weights = GIGPO.assign(rollouts)
    shared = build_samples(rollouts, weights, snapshot_policy="share")
    e3 = [s for s in shared if s.meta["rollout_id"] == "e3"]
    assert [(s.meta["turn_index"], s.meta["is_snapshot"]) for s in e3] == [
        (0, False),
        (1, True),
        (1, False),
        (2, False),
    ]
    assert [s.weight for s in e3] == pytest.approx(
        [EXPECTED["e3"][0], EXPECTED["e3"][1], EXPECTED["e3"][1], EXPECTED["e3"][2]], abs=1e-12
    )
    assert e3[1].meta["state_key"] == e3[2].meta["state_key"] == B
    split = build_samples(rollouts, weights, snapshot_policy="split")
    halves = [s.weight for s in split if s.meta["rollout_id"] == "e3" and s.meta["turn_index"] == 1]
    assert halves == pytest.approx([EXPECTED["e3"][1] / 2] * 2, abs=1e-12)
    assert len(shared) == len(split) == 3 + 5 + 4


def anchor_versions(samples: list[SAWItem]) -> dict[str, set[int]]:
    versions: dict[str, set[int]] = defaultdict(set)
    for s in samples:
        versions[s.meta["state_key"]].update(s.meta["policy_versions"])
    return dict(versions)


async def test_an_anchor_group_mixes_policy_versions_and_credit_ignores_them() -> None:
    rollouts = await group()
    samples = build_samples(rollouts, GIGPO.assign(rollouts))
    assert anchor_versions(samples) == {A: {0, 1}, B: {0, 1}, C: {1}, D: {0, 1}}
    # Relabelling e1 as version 1 changes no advantage: versions are recorded, not weighed.
    for step in rollouts[0].agent_steps:
        object.__setattr__(step, "policy_version", 1)
    again = build_samples(rollouts, GIGPO.assign(rollouts))
    assert [s.weight for s in again] == [s.weight for s in samples]
    assert anchor_versions(again)[A] == {1}


class FixedBatches:
    def __init__(self, batch: SAWBatch) -> None:
        self.batch = batch

    def next_batch(self) -> SAWBatch:
        return self.batch


def tiny_byte_model() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


async def test_one_trainer_step_on_mixed_version_gigpo_samples() -> None:
    rollouts = await group()
    samples = build_samples(rollouts, make_gigpo().credit_assigner.assign(rollouts))
    batch = SAWBatch(items=samples, rollouts=rollouts)
    model = tiny_byte_model()
    before = [p.detach().clone() for p in model.parameters()]
    config: dict[str, Any] = {"lr": 1e-3, "initial_policy_version": 1}
    trainer = Trainer(model, make_gigpo(), FixedBatches(batch), TrainerConfig(**config))
    metrics = await trainer.train_step()
    assert metrics["num_samples"] == len(samples) == 12
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
    assert trainer.policy_version == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # With max_lag=0 at version 1, e1's version-0 samples are stale: the async pipeline's rule.
    strict = Trainer(
        tiny_byte_model(),
        make_gigpo(),
        FixedBatches(batch),
        TrainerConfig(**config, max_lag=0),
    )
    dropped = await strict.train_step()
    assert dropped["dropped_stale"] == 3 and dropped["num_samples"] == 9
