"""The same request object k times in one batch (`requests_fn=lambda: [problem] * 4`, as the
README's "Train your own environment" writes it) is k problems: each gets its own GRPO group,
not one group mixing every copy's env seeds."""

from __future__ import annotations

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import GroupNormalizedReturn, RolloutBatchSource
from ludic.types import Info, StepOutcome


class ParityEnv(SingleAgentEnv):
    """One step; reward = the env seed's parity, whatever the action (the problem decides)."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        self.seed = seed or 0
        return f"seed {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=float(self.seed % 2), terminated=True)


async def test_copies_of_one_request_are_separate_groups() -> None:
    engine = RolloutEngine(
        env_registry={"parity": ParityEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(ScriptedClient(["a"])), max_steps=1)
        },
    )
    problem = RolloutRequest(
        env=ComponentSpec(name="parity"), protocol=ComponentSpec(name="single"), request_id="q"
    )
    source = RolloutBatchSource(
        engine=engine,
        requests_fn=lambda: [problem] * 4,
        credit_assigner=GroupNormalizedReturn(),
        strategy=GRPORequestStrategy(group_size=2),
        seed_sequencer=SeedSequencer(run_seed=0),
    )
    batch = await source.next_batch()
    seeds_by_group: dict[str, set[int]] = {}
    for rollout in batch.rollouts:
        seeds_by_group.setdefault(str(rollout.group_id), set()).add(rollout.meta["env_seed"])
    assert sorted(seeds_by_group) == ["q", "q@1", "q@2", "q@3"]
    assert all(len(seeds) == 1 for seeds in seeds_by_group.values())  # one problem per group
    rewards = {r.total_reward for r in batch.rollouts}
    assert rewards == {0.0, 1.0}  # the problems differ (seeds of both parities here) ...
    # ... but within a group both episodes got the same reward: every advantage is exactly 0
    # (one group of all 8 gave +-0.93 by problem, not by action)
    assert [item.weight for item in batch.items] == [0.0] * 8
