"""`PrefetchBatchSource(lend_idle_threads=...)`: the Trainer's thread takes more torch threads
once the batch in flight is drawn (between layers, also mid-backward), gives them back before
the next draw starts, touches no other thread, changes nothing when off, and trains to the same
numbers."""

from __future__ import annotations

import asyncio
import copy
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from training_fakes import ListSource, WeightedNLL, mixed_items, params_snapshot, tiny_llama

from ludic.distributed import InProcessPublisher
from ludic.inference import EmbeddedEngine
from ludic.models import load_tiny_model
from ludic.rollouts import GRPORequestStrategy, SeedSequencer
from ludic.training import (
    ConstantCredit,
    PrefetchBatchSource,
    RLAlgorithm,
    RolloutBatchSource,
    SAWBatch,
    Trainer,
    TrainerConfig,
    make_grpo,
)
from ludic.training.batching import prefetch


@pytest.fixture(autouse=True)
def one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def never_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lent threads are kept whatever the layers' timing (tests of the mechanics: on a tiny
    model a second thread may well be slower)."""
    monkeypatch.setattr(prefetch, "LENT_SPEEDUP", math.inf)


class GatedSource:
    """Each draw after the first waits for `release` (set it to let the draw finish)."""

    def __init__(self) -> None:
        self.draws = 0
        self.release = threading.Event()

    async def next_batch(self) -> SAWBatch:
        self.draws += 1
        while self.draws > 1 and not self.release.is_set():
            await asyncio.sleep(0.005)
        return SAWBatch(items=mixed_items(2))


def threads_seen(model: torch.nn.Module) -> list[int]:
    """Records the caller's torch thread count at each layer's forward and in the backward
    through the first layer's input."""
    seen: list[int] = []
    first = model.model.layers[0]

    def record_backward(_m: object, args: tuple[torch.Tensor, ...], kwargs: dict) -> None:
        hidden_BTH = args[0] if args else kwargs["hidden_states"]
        if hidden_BTH.requires_grad:
            hidden_BTH.register_hook(lambda _g: seen.append(-torch.get_num_threads()))

    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    first.register_forward_pre_hook(record_backward, with_kwargs=True)
    return seen  # backward entries are negative


@dataclass(frozen=True, slots=True)
class Lending:
    """A `PrefetchBatchSource` over a `GatedSource`, watching `model`; `seen` records the
    thread counts `record` hooks see (empty without one)."""

    inner: GatedSource
    source: PrefetchBatchSource
    model: torch.nn.Module
    seen: list[int]

    async def first_draw(self) -> SAWBatch:
        """The first batch, and the second drawn (the gate open) before returning."""
        batch = await self.source.next_batch()
        self.source.wait(timeout=10)
        return batch


@contextmanager
def lending(
    model: torch.nn.Module,
    *,
    lend: int | bool = 2,
    released: bool = True,
    record: Callable[[torch.nn.Module], list[int]] | None = None,
) -> Iterator[Lending]:
    """The setup every test here shares; the gate opened (`released`) or held, and the source
    closed at the end (the gate opened first, so no draw is left waiting on it)."""
    inner = GatedSource()
    if released:
        inner.release.set()
    source = PrefetchBatchSource(inner, lend_idle_threads=lend)
    source.watch_model(model)
    seen = record(model) if record is not None else []
    try:
        yield Lending(inner, source, model, seen)
    finally:
        inner.release.set()
        source.close()


def forward_backward(model: torch.nn.Module, *, backward: bool = True) -> torch.Tensor:
    ids_BT = torch.randint(1, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    embeds_BTH = model.get_input_embeddings()(ids_BT)
    loss = model(inputs_embeds=embeds_BTH).logits.logsumexp(-1).mean()
    if backward:
        loss.backward()
    return loss


async def test_threads_are_lent_once_the_draw_is_done_and_given_back_before_the_next(
    never_drop: None,
) -> None:
    with lending(tiny_llama(), released=False, record=threads_seen) as run:
        source, seen = run.source, run.seen
        await source.next_batch()  # batch 2 is in flight, held by the gate
        forward_backward(run.model)
        assert seen == [1, 1, -1] and not source.lending  # the draw runs: nothing lent
        run.inner.release.set()
        source.wait(timeout=10)
        forward_backward(run.model)
        assert seen[3:] == [2, 2, -2] and source.lending
        batch = await source.next_batch()
        assert torch.get_num_threads() == 1 and not source.lending  # back before the next draw
        assert batch.stats["prefetch_lent_seconds"] > 0
    assert torch.get_num_threads() == 1


async def test_the_lend_happens_mid_backward(never_drop: None) -> None:
    with lending(tiny_llama(), record=threads_seen) as run:
        source = run.source
        await run.first_draw()
        run.inner.release.clear()
        batch = await source.next_batch()  # the third draw waits on the gate
        assert batch.stats["prefetch_lent_seconds"] == 0.0
        loss = forward_backward(run.model, backward=False)  # the forward runs while it draws
        run.inner.release.set()
        source.wait(timeout=10)
        assert torch.get_num_threads() == 1
        loss.backward()  # a hook on the last layer's output gradient sees the draw done
        assert run.seen == [1, 1, -2] and source.lending
    assert torch.get_num_threads() == 1 and not source.lending  # close gives them back


async def test_off_changes_nothing_and_registers_no_hook() -> None:
    with lending(tiny_llama(), lend=False) as run:
        model = run.model
        assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
        seen = threads_seen(model)
        await run.first_draw()
        forward_backward(model)
        batch = await run.source.next_batch()
    assert seen == [1, 1, -1] and "prefetch_lent_seconds" not in batch.stats


async def test_another_thread_running_the_model_is_never_lent_threads(never_drop: None) -> None:
    with lending(tiny_llama(), record=threads_seen) as run:
        await run.first_draw()
        worker = threading.Thread(target=lambda: forward_backward(run.model))
        worker.start()
        worker.join()
        assert run.seen == [1, 1, -1] and not run.source.lending
        assert torch.get_num_threads() == 1


async def test_bad_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="thread count >= 1"):
        PrefetchBatchSource(GatedSource(), lend_idle_threads=0)
    source = PrefetchBatchSource(GatedSource(), lend_idle_threads=True)  # no watch_model
    try:
        with pytest.raises(RuntimeError, match="watch_model"):
            await source.next_batch()
    finally:
        source.close()


def trained(lend: bool) -> tuple[list[float], dict[str, torch.Tensor], list[float]]:
    model = tiny_llama()
    algorithm = RLAlgorithm(name="t", credit_assigner=ConstantCredit(value=1.0), loss=WeightedNLL())
    batches = [mixed_items(4, seed=s) for s in range(3)]
    source = PrefetchBatchSource(ListSource(batches), lend_idle_threads=2 if lend else False)
    trainer = Trainer(model, algorithm, source, TrainerConfig(lr=1e-2))
    try:
        history = [asyncio.run(trainer.train_step()) for _ in range(3)]
    finally:
        source.close()
    lent = [m.get("batch/prefetch_lent_seconds", 0.0) for m in history]
    return [m["loss"] for m in history], params_snapshot(model), lent


def test_the_trainer_trains_to_the_same_numbers_with_lent_threads(never_drop: None) -> None:
    losses_off, params_off, lent_off = trained(lend=False)
    losses_on, params_on, lent_on = trained(lend=True)
    assert torch.get_num_threads() == 1
    assert lent_off == [0.0, 0.0, 0.0] and all(s > 0 for s in lent_on[1:])  # it really lent
    assert losses_on == pytest.approx(losses_off, rel=1e-5)
    for name, value in params_off.items():
        torch.testing.assert_close(params_on[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_grpo_on_the_embedded_engine_with_lent_threads(never_drop: None) -> None:
    """The README's overlapped loop (embedded engine on its own thread, InProcessPublisher)
    with lending on: it lends, gives back, and the engine thread keeps its one thread."""
    from test_prefetch import say_o_rollouts

    model, tokenizer = load_tiny_model()
    engine = EmbeddedEngine(copy.deepcopy(model), tokenizer)
    engine_threads: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda *_: engine_threads.append(torch.get_num_threads())
    )
    rollouts, problem = say_o_rollouts(engine)
    algorithm = make_grpo()
    source = PrefetchBatchSource(
        RolloutBatchSource(
            engine=rollouts,
            requests_fn=lambda: [problem],
            credit_assigner=algorithm.credit_assigner,
            strategy=GRPORequestStrategy(group_size=4),
            seed_sequencer=SeedSequencer(run_seed=0),
        ),
        lend_idle_threads=2,
    )
    # the step's forward first waits for the draw (registered before the Trainer's hooks), so
    # every step lends deterministically, whichever side is faster on this machine
    model.model.layers[0].register_forward_pre_hook(lambda *_: source.wait(timeout=60))
    config = TrainerConfig(lr=1e-3, pad_token_id=int(tokenizer.pad_token_id), max_lag=1)
    trainer = Trainer(model, algorithm, source, config, publisher=InProcessPublisher(engine))
    try:
        history = [asyncio.run(trainer.train_step()) for _ in range(3)]
    finally:
        source.close()
        engine.close()
    assert all(m["num_samples"] == 4 and m["dropped_stale"] == 0 for m in history)
    assert all(m["batch/prefetch_lent_seconds"] > 0 for m in history[1:])  # the step before
    assert set(engine_threads) == {1} and torch.get_num_threads() == 1


class SleepLayer(torch.nn.Module):
    """Takes `seconds(threads)` at the caller's torch thread count."""

    def __init__(self, faster_with_more_threads: bool) -> None:
        super().__init__()
        self.faster = faster_with_more_threads

    def forward(self, x_BH: torch.Tensor) -> torch.Tensor:
        threads = torch.get_num_threads()
        # 2x apart either way, with room for a scheduling stall of ~50 ms on a loaded box (a
        # 30 ms lent layer against a 60 ms reference failed once in CI under load 14)
        time.sleep(0.2 / threads if self.faster else 0.06 * threads)
        return x_BH + 1


class Stack(torch.nn.Module):
    def __init__(self, faster_with_more_threads: bool) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(SleepLayer(faster_with_more_threads) for _ in range(4))

    def forward(self, x_BH: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BH = layer(x_BH)
        return x_BH


def stack_threads_seen(model: torch.nn.Module) -> list[int]:
    seen: list[int] = []
    for layer in model.layers:
        layer.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    return seen


async def lent_forward(run: Lending) -> SAWBatch:
    """One step: the draw is held through one forward on own threads (the reference), then
    released before a second forward."""
    run.inner.release.clear()
    batch = await run.source.next_batch()
    run.model(torch.zeros(1, 2))
    run.inner.release.set()
    run.source.wait(timeout=10)
    run.model(torch.zeros(1, 2))
    return batch


async def test_lent_threads_that_do_not_pay_are_dropped_and_sat_out_then_tried_again() -> None:
    with lending(Stack(faster_with_more_threads=False), record=stack_threads_seen) as run:
        seen = run.seen
        await run.first_draw()
        await lent_forward(run)
        assert seen[4:] == [2, 1, 1, 1]  # one slower layer, then back to its own thread
        assert torch.get_num_threads() == 1 and not run.source.lending
        batch = await lent_forward(run)
        assert batch.stats["prefetch_lend_dropped"] == 1.0
        assert batch.stats["prefetch_lent_seconds"] > 0
        assert seen[12:] == [1, 1, 1, 1]  # sat out one step
        batch = await lent_forward(run)
        assert batch.stats["prefetch_lent_seconds"] == batch.stats["prefetch_lend_dropped"] == 0.0
        assert seen[20:] == [2, 1, 1, 1]  # tried again, dropped again: now sits out two
        await lent_forward(run)
        await lent_forward(run)
        assert seen[28:32] == [1, 1, 1, 1] and seen[36:40] == [1, 1, 1, 1]  # sat out two


async def test_lent_threads_that_pay_are_kept() -> None:
    with lending(Stack(faster_with_more_threads=True), record=stack_threads_seen) as run:
        await run.first_draw()
        await lent_forward(run)
        batch = await lent_forward(run)
        assert run.seen[4:8] == [2, 2, 2, 2] and run.seen[12:] == [2, 2, 2, 2]
        assert batch.stats["prefetch_lend_dropped"] == 0.0
