"""RolloutBatchSource (engine + requests + credit), the queue requests_fn and
OfflineBatchSource (JSONL rollouts, seeded shuffling, epochs, filters, resume)."""

from __future__ import annotations

import queue
from collections import defaultdict
from pathlib import Path

import pytest
from training_fakes import WeightedNLL, tiny_llama

from ludic.agents import Agent
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.scripted import ScriptedClient
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import (
    BatchSource,
    ConstantCredit,
    GroupNormalizedReturn,
    OfflineBatchSource,
    RequestsExhausted,
    RLAlgorithm,
    RolloutBatchSource,
    StatefulBatchSource,
    Trainer,
    TrainerConfig,
    drop_parse_errors,
    make_requests_fn_from_queue,
)
from ludic.types import Info, StepOutcome


class CoinEnv(SingleAgentEnv):
    """One step: reward 1 for "heads"."""

    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return f"flip {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=float(action == "heads"), terminated=True)


class SeedParityClient:
    """ "heads" when the episode's sampling seed is odd, else "tails"."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        text = "heads" if (request.sampling.seed or 0) % 2 else "tails"
        return await ScriptedClient([text], policy_version=4).complete(request)


def engine(**kwargs: object) -> RolloutEngine:
    return RolloutEngine(
        env_registry={"coin": CoinEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(SeedParityClient()), max_steps=1)
        },
        **kwargs,  # type: ignore[arg-type]
    )


def request(i: int) -> RolloutRequest:
    return RolloutRequest(
        env=ComponentSpec(name="coin"), protocol=ComponentSpec(name="single"), request_id=f"q{i}"
    )


async def test_rollout_source_generates_grpo_batches() -> None:
    source = RolloutBatchSource(
        engine=engine(),
        requests_fn=lambda: [request(0), request(1)],
        credit_assigner=GroupNormalizedReturn(normalize_std=False),
        strategy=GRPORequestStrategy(group_size=4),
        seed_sequencer=SeedSequencer(run_seed=3),
    )
    assert isinstance(source, BatchSource) and isinstance(source, StatefulBatchSource)
    batch = await source.next_batch()
    assert len(batch.items) == 8 and len(batch.rollouts) == 8
    assert batch.stats["num_rollouts"] == 8.0 and batch.stats["num_failed"] == 0.0
    by_group: dict[str, list[float]] = defaultdict(list)
    for sample in batch.items:
        by_group[sample.meta["group_id"]].append(sample.weight)
        assert sample.meta["policy_versions"] == [4]
    assert len(by_group) == 2
    assert all(abs(sum(w)) < 1e-9 for w in by_group.values())  # R - mean(R) sums to 0
    assert source.state_dict() == {"batch_index": 1}
    # Seeds come from the batch index: replaying index 0 gives the same episodes.
    second = await source.next_batch()
    source.load_state_dict({"batch_index": 0})
    replay = await source.next_batch()
    assert [s.input_ids for s in replay.items] == [s.input_ids for s in batch.items]
    assert {r.meta["env_seed"] for r in second.rollouts} != {
        r.meta["env_seed"] for r in batch.rollouts
    }


def test_queue_requests_fn() -> None:
    items: queue.Queue[int] = queue.Queue()
    for i in range(5):
        items.put(i)
    fn = make_requests_fn_from_queue(items, batch_size=2, build_request=request)
    assert [r.request_id for r in fn()] == ["q0", "q1"]
    assert [r.request_id for r in fn()] == ["q2", "q3"]
    assert [r.request_id for r in fn()] == ["q4"]
    with pytest.raises(RequestsExhausted):
        fn()
    items.put(7)
    strict = make_requests_fn_from_queue(items, batch_size=2, build_request=request, drop_last=True)
    with pytest.raises(RequestsExhausted):
        strict()
    assert items.qsize() == 1  # the short batch was put back
    with pytest.raises(ValueError, match="batch_size"):
        make_requests_fn_from_queue(items, batch_size=0, build_request=request)


async def test_trainer_on_rollout_source_stops_when_queue_is_empty() -> None:
    items: queue.Queue[int] = queue.Queue()
    for i in range(3):
        items.put(i)
    source = RolloutBatchSource(
        engine=engine(),
        requests_fn=make_requests_fn_from_queue(items, batch_size=2, build_request=request),
        credit_assigner=ConstantCredit(value=1.0),
        strategy=GRPORequestStrategy(group_size=2),
    )
    algorithm = RLAlgorithm(name="t", credit_assigner=ConstantCredit(), loss=WeightedNLL())
    trainer = Trainer(tiny_llama(), algorithm, source, TrainerConfig())
    history = await trainer.train(10, progress=False)
    assert [h["num_samples"] for h in history] == [4.0, 2.0]
    assert history[0]["batch/num_rollouts"] == 4.0


async def _write_log(path: Path, n: int) -> None:
    requests = SeedSequencer(run_seed=0).seed_requests([request(i) for i in range(n)], 0)
    await engine(jsonl_log=path).run(requests)


async def test_offline_source_epochs_shuffle_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    await _write_log(path, 7)

    def make(**kw: object) -> OfflineBatchSource:
        return OfflineBatchSource(
            paths=path, credit_assigner=ConstantCredit(value=1.0), batch_size=3, seed=5, **kw
        )  # type: ignore[arg-type]

    source = make()
    epoch0 = [await source.next_batch() for _ in range(3)]
    assert [len(b.items) for b in epoch0] == [3, 3, 1]
    ids0 = [s.meta["rollout_id"] for b in epoch0 for s in b.items]
    assert len(set(ids0)) == 7  # every sample once per epoch
    first_of_epoch1 = await source.next_batch()
    assert first_of_epoch1.stats["epoch"] == 1.0
    state = source.state_dict()
    assert (state["epoch"], state["position"], state["num_samples"]) == (1, 3, 7)

    again = make()  # same seed: same order
    assert [s.meta["rollout_id"] for s in (await again.next_batch()).items] == ids0[:3]

    resumed = make()
    resumed.load_state_dict(source.state_dict())
    expected = await source.next_batch()
    assert [s.input_ids for s in (await resumed.next_batch()).items] == [
        s.input_ids for s in expected.items
    ]
    ids1 = [s.meta["rollout_id"] for s in first_of_epoch1.items + expected.items]
    assert ids1 != ids0[:6]  # a new permutation each epoch


async def test_offline_source_limits_and_filters(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    await _write_log(path, 4)
    source = OfflineBatchSource(
        paths=[path],
        credit_assigner=ConstantCredit(),
        batch_size=3,
        shuffle=False,
        num_epochs=1,
        drop_last=True,
    )
    assert len((await source.next_batch()).items) == 3
    from ludic.training import BatchSourceExhausted

    with pytest.raises(BatchSourceExhausted):
        await source.next_batch()

    def no_heads(sample: object) -> bool:
        return b"heads" not in bytes(t for t in sample.input_ids if t < 256)  # type: ignore[attr-defined]

    filtered = OfflineBatchSource(
        paths=path,
        credit_assigner=ConstantCredit(),
        batch_size=8,
        filters=[no_heads, drop_parse_errors()],
    )
    assert filtered.num_filtered_out + len(filtered.samples) == 4 and filtered.num_filtered_out > 0
    with pytest.raises(ValueError, match="no samples"):
        OfflineBatchSource(
            paths=path, credit_assigner=ConstantCredit(), batch_size=2, filters=[lambda s: False]
        )
