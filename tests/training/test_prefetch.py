"""PrefetchBatchSource: the next batch is drawn while the caller works, in order, errors reach
the caller, checkpoints re-draw the batch in flight, and a Trainer on the embedded engine runs
one version off-policy within max_lag=1."""

from __future__ import annotations

import asyncio
import copy
import threading

import httpx
import pytest
import torch
from training_fakes import item, tiny_llama

from ludic.agents import Agent
from ludic.distributed import InProcessPublisher
from ludic.distributed.verification import reference_logprobs
from ludic.envs.single_agent import SingleAgentEnv
from ludic.inference import ChatClient, EmbeddedEngine, SamplingConfig
from ludic.inference.http.local_server import LocalServer
from ludic.interaction import SingleAgentProtocol
from ludic.models import load_tiny_model, tiny_model_dir
from ludic.recipes.inference import make_inference
from ludic.rollouts import (
    ComponentSpec,
    GRPORequestStrategy,
    RolloutEngine,
    RolloutRequest,
    SeedSequencer,
)
from ludic.training import (
    PrefetchBatchSource,
    RolloutBatchSource,
    SAWBatch,
    Trainer,
    TrainerConfig,
    make_grpo,
)
from ludic.types import JSON, Info, StepOutcome


class CountingSource:
    """Batch i holds one item whose first token is i; records the thread of every draw."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.drawn = 0
        self.fail_at = fail_at
        self.threads: set[str] = set()
        self.loops: set[int] = set()

    async def next_batch(self) -> SAWBatch:
        self.threads.add(threading.current_thread().name)
        self.loops.add(id(asyncio.get_running_loop()))
        if self.drawn == self.fail_at:
            raise ValueError(f"batch {self.drawn} failed")
        index = self.drawn
        self.drawn += 1
        return SAWBatch(items=[item(3, index=index)])

    def state_dict(self) -> JSON:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: JSON) -> None:
        self.drawn = int(state["drawn"])


def first_token(batch: SAWBatch) -> int:
    index = batch.items[0].meta["index"]
    assert isinstance(index, int)
    return index


async def test_the_next_batch_is_drawn_in_the_background_in_order() -> None:
    inner = CountingSource()
    source = PrefetchBatchSource(inner)
    try:
        assert first_token(await source.next_batch()) == 0
        source.wait(timeout=10)
        assert inner.drawn == 2  # batch 1 was drawn with no call from us
        assert [first_token(await source.next_batch()) for _ in range(3)] == [1, 2, 3]
        assert inner.threads == {"ludic-prefetch"}
        assert len(inner.loops) == 1  # one loop for every draw
    finally:
        source.close()


async def test_an_error_in_a_draw_reaches_the_caller() -> None:
    source = PrefetchBatchSource(CountingSource(fail_at=1))
    try:
        await source.next_batch()
        with pytest.raises(ValueError, match="batch 1 failed"):
            await source.next_batch()
    finally:
        source.close()


async def test_a_checkpoint_redraws_the_batch_in_flight() -> None:
    source = PrefetchBatchSource(CountingSource())
    try:
        await source.next_batch()
        await source.next_batch()
        source.wait(timeout=10)
        state = source.state_dict()
        assert state == {"drawn": 2}  # batch 2 is in flight, not yet handed over
        with pytest.raises(RuntimeError, match="before the first step"):
            source.load_state_dict(state)
    finally:
        source.close()
    resumed = PrefetchBatchSource(CountingSource())
    try:
        resumed.load_state_dict(state)
        assert first_token(await resumed.next_batch()) == 2
    finally:
        resumed.close()


class GatedSource(CountingSource):
    """Each draw waits until `gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = 0

    async def next_batch(self) -> SAWBatch:
        self.started += 1
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        return await super().next_batch()


async def test_a_cancelled_caller_leaves_the_batch_in_flight() -> None:
    inner = GatedSource()
    source = PrefetchBatchSource(inner)
    try:
        waiting = asyncio.create_task(source.next_batch())
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        inner.gate.set()
        assert first_token(await source.next_batch()) == 0  # the same draw, not a second one
        source.wait(timeout=10)
        assert inner.started == inner.drawn == 2
    finally:
        source.close()


class SayOEnv(SingleAgentEnv):
    def env_reset(self, seed: int | None = None) -> tuple[str, Info]:
        return "Say something.", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="", reward=action.count("o") / max(1, len(action)), terminated=True)


def say_o_rollouts(client: ChatClient) -> tuple[RolloutEngine, RolloutRequest]:
    """One-step `SayOEnv` episodes sampled (8 tokens, eos ignored) from `client`."""
    sampling = SamplingConfig(max_tokens=8, extras={"ignore_eos": True})
    rollouts = RolloutEngine(
        env_registry={"say_o": SayOEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(Agent(client, sampling=sampling), max_steps=1)
        },
    )
    problem = RolloutRequest(env=ComponentSpec(name="say_o"), protocol=ComponentSpec(name="single"))
    return rollouts, problem


@pytest.mark.slow
def test_trainer_with_prefetch_trains_one_version_off_policy_on_the_engine() -> None:
    model, tokenizer = load_tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
    rollouts, problem = say_o_rollouts(engine)
    algorithm = make_grpo()
    source = PrefetchBatchSource(
        RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [problem],
            credit_assigner=algorithm.credit_assigner,
            strategy=GRPORequestStrategy(group_size=4),
            seed_sequencer=SeedSequencer(run_seed=0),
        )
    )
    config = TrainerConfig(lr=1e-3, pad_token_id=int(tokenizer.pad_token_id), max_lag=1)
    trainer = Trainer(model, algorithm, source, config, publisher=InProcessPublisher(engine))
    try:
        history = trainer.run(3, progress=False)
    finally:
        source.close()
        engine.close()
    assert len(history) == 3
    assert all(m["num_samples"] == 4 and m["dropped_stale"] == 0 for m in history)
    assert engine.policy_version == trainer.policy_version == 3
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


class VersionRecorder:
    """Wraps a source: for each draw, the trainer's policy version when it started and the
    policy versions the drawn samples carry."""

    def __init__(self, source: RolloutBatchSource) -> None:
        self.source = source
        self.trainer: Trainer | None = None
        self.draws: list[tuple[int, set[int]]] = []

    async def next_batch(self) -> SAWBatch:
        assert self.trainer is not None
        started_at = self.trainer.policy_version
        batch = await self.source.next_batch()
        versions = {v for item in batch.items for v in item.policy_versions}
        self.draws.append((started_at, versions))
        return batch


@pytest.mark.slow
def test_generation_in_a_server_process_trains_one_version_off_policy() -> None:
    """The README's process-parallel loop: `ludic serve` in a child process (LocalServer), its
    HTTP client and BroadcastPolicyPublisher from make_inference, PrefetchBatchSource and
    max_lag=1. Each batch is sampled by the policy served when its draw began (or the next one,
    pushed while it ran), every step after the first trains one version behind, and the server
    ends up serving the trainer's final weights."""
    model, tokenizer = load_tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    steps = 4
    with LocalServer(tiny_model_dir(), threads=1) as server:
        inference = make_inference(
            model, tokenizer, server_url=server.url, server_token=server.token
        )
        client, publisher = inference.client, inference.publisher
        assert publisher is not None
        rollouts, problem = say_o_rollouts(client)
        algorithm = make_grpo()
        recorder = VersionRecorder(
            RolloutBatchSource(
                engine=rollouts,
                requests_fn=lambda: [problem],
                credit_assigner=algorithm.credit_assigner,
                strategy=GRPORequestStrategy(group_size=4),
                seed_sequencer=SeedSequencer(run_seed=0),
            )
        )
        source = PrefetchBatchSource(recorder)
        config = TrainerConfig(lr=1e-3, pad_token_id=int(tokenizer.pad_token_id), max_lag=1)
        trainer = Trainer(model, algorithm, source, config, publisher=publisher)
        recorder.trainer = trainer
        try:
            history = trainer.run(steps, progress=False)
        finally:
            source.close()
            publisher.close()
        auth = {"Authorization": f"Bearer {server.token}"}
        served = httpx.get(server.url + "/ludic/version", headers=auth, timeout=30).json()
        probe_ids = [5, 17, 99, 3, 250, 42]
        probe = httpx.post(
            server.url + "/ludic/logprobs", json={"token_ids": probe_ids}, headers=auth, timeout=30
        ).json()
    assert len(history) == steps and trainer.policy_version == steps
    assert served == {"policy_version": steps}  # every update was pushed and taken
    assert probe["logprobs"] == pytest.approx(reference_logprobs(model, probe_ids), abs=1e-4)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    # Draw k began when batch k-1 was handed over (trainer at version k-2 for k >= 2); the
    # server then served that version, or the next one once its push landed mid-draw.
    for started_at, versions in recorder.draws:
        assert versions and versions <= {started_at, started_at + 1}, recorder.draws
    assert all(m["num_samples"] == 4 and m["dropped_stale"] == 0 for m in history)
    assert history[0]["policy_lag/mean"] == 0  # the first batch is drawn before any update
    lags = [m["policy_lag/mean"] for m in history[1:]]
    assert all(0 <= lag <= 1 for lag in lags) and max(lags) == 1, lags  # overlapped
    assert all(m["batch/prefetch_draw_seconds"] > 0 for m in history)


def test_trainer_refuses_prefetch_with_max_lag_0_before_drawing() -> None:
    """Every prefetched batch is one version old when it arrives: with max_lag=0 every second
    step would drop its batch as stale, forever. Refused at construction, naming the fix."""
    source = CountingSource()
    prefetch = PrefetchBatchSource(source)
    try:
        with pytest.raises(
            ValueError, match=r"max_lag=0\) with a PrefetchBatchSource.*Set max_lag=1"
        ):
            Trainer(tiny_llama(), make_grpo(), prefetch, TrainerConfig(max_lag=0))
        assert source.drawn == 0
        Trainer(tiny_llama(), make_grpo(), prefetch, TrainerConfig(max_lag=1)).close()
    finally:
        prefetch.close()
