"""generate_batch: expand -> run -> credit -> samples -> filters, with batch stats."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rollout_fakes import CountEnv, LoopProtocol

from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient
from ludic.rollouts import (
    ComponentSpec,
    CreditAssigner,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
    generate_batch,
)
from ludic.types import Rollout


class SeedParityClient:
    """Answers "ok" (reward 1) when the episode's sampling seed is odd, else "no"."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        text = "ok" if (request.sampling.seed or 0) % 2 else "no"
        return await ScriptedClient([text]).complete(request)


class GroupMeanBaseline:
    """A = R - mean(R over the rollout's group), for every turn; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[Rollout] = []

    def assign(self, rollouts: Sequence[Rollout]) -> dict[tuple[str, str], float]:
        self.seen = list(rollouts)
        groups: dict[str | None, list[float]] = defaultdict(list)
        for r in rollouts:
            groups[r.group_id].append(r.total_reward)
        return {
            (r.id, t.turn_id): r.total_reward - sum(groups[r.group_id]) / len(groups[r.group_id])
            for r in rollouts
            for t in r.turns()
        }


def engine(**kwargs) -> RolloutEngine:
    return RolloutEngine(
        env_registry={"count": lambda **kw: CountEnv(**kw)},
        protocol_registry={"loop": lambda **kw: LoopProtocol(SeedParityClient(), **kw)},
        **kwargs,
    )


def logical(i: int, **env) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="count", kwargs={"length": 2, **env}),
        protocol=ComponentSpec(name="loop"),
        request_id=f"q{i}",
    )


async def test_grpo_batch_end_to_end() -> None:
    credit = GroupMeanBaseline()
    assert isinstance(credit, CreditAssigner)
    requests = SeedSequencer(run_seed=1).seed_requests([logical(0), logical(1)], batch_index=0)
    result = await generate_batch(
        engine(), requests, credit, strategy=GRPORequestStrategy(group_size=4)
    )
    assert len(result.rollouts) == 8 and result.stats.num_failed == 0
    assert result.stats.num_samples == len(result.samples) == 16  # 8 episodes x 2 turns
    assert result.stats.num_agent_steps == 16
    by_group: dict[str, list] = defaultdict(list)
    for s in result.samples:
        by_group[s.meta["group_id"]].append(s)
        # Every turn of a rollout has reward 1 ("ok") or 0; weights are the baselined return.
        rollout = next(r for r in result.rollouts if r.id == s.meta["rollout_id"])
        group = [r for r in result.rollouts if r.group_id == rollout.group_id]
        mean = sum(r.total_reward for r in group) / len(group)
        assert s.weight == rollout.total_reward - mean
    assert set(by_group) == {"q0", "q1"}
    # The group members really sampled differently (distinct seeds) on the same problem.
    for gid in ("q0", "q1"):
        members = [r for r in result.rollouts if r.group_id == gid]
        assert len({r.meta["env_seed"] for r in members}) == 1
        assert len({r.meta["sampling_seed"] for r in members}) == 4
    expected_mean = sum(r.total_reward for r in result.rollouts) / 8
    assert result.stats.mean_reward == expected_mean


async def test_failed_episodes_are_kept_out_of_credit_and_samples_and_counted() -> None:
    credit = GroupMeanBaseline()
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="count", kwargs={"length": 2}),
            protocol=ComponentSpec(name="loop"),
            sampling_seed=1,
            request_id="a",
        ),
        RolloutRequest(
            env=ComponentSpec(name="count", kwargs={"fail_at": 0}),
            protocol=ComponentSpec(name="loop"),
            request_id="b",
        ),
        RolloutRequest(
            env=ComponentSpec(name="count", kwargs={"hang_at": 1}),
            protocol=ComponentSpec(name="loop"),
            request_id="c",
        ),
    ]
    result = await generate_batch(engine(episode_timeout_s=0.2), requests, credit)
    assert [r.meta["request_id"] for r in credit.seen] == ["a"]
    assert {s.meta["request_id"] for s in result.samples} == {"a"}
    stats = result.stats
    assert (stats.num_rollouts, stats.num_failed, stats.num_timed_out) == (3, 2, 1)
    assert stats.mean_reward == 2.0  # only the episode that ran: two "ok" turns
    assert stats.to_dict()["num_failed"] == 2


async def test_filters_and_snapshot_counts() -> None:
    requests = [
        RolloutRequest(
            env=ComponentSpec(name="count", kwargs={"length": 4}),
            protocol=ComponentSpec(name="loop", kwargs={"forget_at": [2]}),
            sampling_seed=1,
        ),
        RolloutRequest(
            env=ComponentSpec(name="count", kwargs={"length": 3, "truncate": True}),
            protocol=ComponentSpec(name="loop"),
            sampling_seed=1,
        ),
    ]
    result = await generate_batch(
        engine(),
        requests,
        GroupMeanBaseline(),
        sample_mode="episode",
        filters=[lambda s: not s.meta["episode_truncated"]],
    )
    # Episode 1 forgot its context before turn 2: one snapshot + one final segment. Episode 2
    # was truncated by the env and filtered out.
    assert [s.meta["is_snapshot"] for s in result.samples] == [True, False]
    assert [s.meta["turn_ids"] for s in result.samples] == [["t0", "t1"], ["t2", "t3"]]
    assert result.stats.num_snapshots == 1 and result.stats.num_filtered_out == 1
    assert result.stats.num_truncated_episodes == 1
