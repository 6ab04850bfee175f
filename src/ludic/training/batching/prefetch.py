"""`PrefetchBatchSource`: generate the next batch while the Trainer trains on this one.

It wraps any batch source and, as soon as it hands a batch to the Trainer, starts drawing the
next one on a background thread (with its own event loop), so rollouts run on the inference
engine while the trainer computes gradients and steps the optimizer. The prefetched batch was
sampled (at least partly) by the policy before the update: samples are one policy version
behind, which the Trainer's `max_lag` (set it to 1 or more) and the losses' importance ratios
account for. It does not add a queue deeper than one batch, nor any cross-process transport
(that is `ludic.pipeline`). The wrapped source must be safe to call from another thread's event
loop (the embedded engine and HTTP clients are). Each batch it hands out carries the seconds its
draw took in `stats["prefetch_draw_seconds"]` (logged as `batch/prefetch_draw_seconds`), beside
the Trainer's `time/batch_seconds` (how long the step waited for it): together they show how much
generation the overlap hid.

For true parallelism on a small model, generate in another process (a `LocalServer` from
`ludic.inference.http.local_server`, or any server, with `BroadcastPolicyPublisher`): this
thread then only waits on HTTP and leaves the interpreter to the optimizer step.

Lending idle threads (`lend_idle_threads=True`, or a thread count): once the batch in flight is
drawn, generation idles until the next `next_batch`, so on a machine with a core per side one
core sits idle for the rest of the training step. With the option on, the thread that calls
`next_batch` (the Trainer's) switches to more intra-op torch threads as soon as it sees the draw
done, and back to its own count before the next draw starts. It looks between the model's
layers (forward pre-hooks, and hooks on each layer's output gradient, so also mid-backward):
give the model with `watch_model(model)` (the Trainer does it). `torch.set_num_threads` is per
OS thread here (OpenMP): it changes only the Trainer's thread; the engine's threads keep their
count. It pays only when a core is really idle: on a machine busy with other jobs the extra
threads wait on a core someone else holds (measured in `bench/lend_threads_probe.py` and
`bench/rl_step.py`'s `_lend` arms), so it is off by default, and it checks itself: each layer
with lent threads must take under `LENT_SPEEDUP` (0.9) of the latest layer of the same phase on
the caller's own threads, else it drops them for the rest of the step and sits out the next
1, 2, 4, ... 16 steps (reset by a lend that pays). `stats["prefetch_lent_seconds"]` and
`stats["prefetch_lend_dropped"]` report the previous step. It lends nothing while a draw is
running, and does not watch a reference model or the optimizer step.

Checkpoints: `state_dict()` is the wrapped source's state from before the batch in flight was
drawn, so a resumed run draws that batch again.

Cross-rank checks: a wrapped source with `check_ranks` (a `RankCheckedSource`, e.g. the pipeline
learner's credit check) keeps it: this source has it too, and then starts the next draw only
after the Trainer's `check_ranks` call, so the ranks compare what the handed batch read, not
part of the next one, and the check never runs beside a draw on the background thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch

from ludic._aio import maybe_await
from ludic.training.batching.types import (
    BatchSource,
    SAWBatch,
    StatefulBatchSource,
    wrapped_sources,
)
from ludic.types import JSON


class PrefetchBatchSource:
    """Keeps one batch of `source` in flight on a background thread; `close()` when done."""

    def __init__(self, source: BatchSource, *, lend_idle_threads: bool | int = False) -> None:
        self.source = source
        self._lend = _lend_count(lend_idle_threads)  # threads while the source idles, or None
        self._lender = _ThreadLender()
        self._hooks: list[Any] = []
        self._watched: torch.nn.Module | None = None
        self._loop = asyncio.new_event_loop()  # one loop for every draw: sources may bind to it
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ludic-prefetch", daemon=True
        )
        self._thread.start()
        self._inflight: Future[SAWBatch] | None = None
        self._state_before: JSON | None = None  # the source's state before the batch in flight
        self._inner_check: Callable[[Callable[[Any], list[Any]]], None] | None = getattr(
            source, "check_ranks", None
        )
        if self._inner_check is not None:  # an instance attribute: RankCheckedSource only then
            self.check_ranks = self._check_ranks

    def watch_model(self, model: torch.nn.Module) -> None:
        """Look for an idle source between `model`'s layers (a no-op unless lending is on).

        The Trainer calls it with its model; call it yourself when driving the source without
        one. The layers are the members of the model's `nn.ModuleList`s (the model itself if it
        has none). A model watched before is no longer (a Trainer that failed to start left its
        hooks on a model the next one does not train)."""
        if self._lend is None or self._watched is model:
            return
        self._unhook()
        self._watched = model
        for layer in _layers(model):
            self._hooks.append(layer.register_forward_pre_hook(lambda *_: self._look("forward")))
            self._hooks.append(layer.register_forward_hook(self._look_in_backward))

    def _unhook(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._watched = None

    @property
    def lending(self) -> bool:
        """True while the caller's thread trains with the lent threads."""
        return self._lender.lent_at is not None

    def _look(self, phase: str) -> None:
        if self._lend is not None:
            inflight = self._inflight
            done = inflight is not None and inflight.done()
            self._lender.look(phase, draw_done=done, threads=self._lend)

    def _look_in_backward(self, _module: object, _args: object, output: object) -> None:
        grad_output = _first_grad_tensor(output)
        if grad_output is not None:  # its gradient comes mid-backward, on the caller's thread
            grad_output.register_hook(lambda _grad: self._look("backward"))

    async def next_batch(self) -> SAWBatch:
        if self._lend is not None and not self._hooks:
            raise RuntimeError(
                "PrefetchBatchSource(lend_idle_threads=...) has no model to watch: give it to a "
                "Trainer (which calls watch_model) or call source.watch_model(model) first"
            )
        self._lender.restore()  # before anything else runs: the draw needs its core
        if self._inflight is None:
            self._start()
        assert self._inflight is not None
        try:  # shielded: a cancelled caller leaves the batch in flight for the next call
            batch = await asyncio.shield(asyncio.wrap_future(self._inflight))
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._inflight = self._state_before = None
            raise
        self._inflight = self._state_before = None
        if self._lend is not None:
            batch = replace(batch, stats={**batch.stats, **self._lender.report()})
        self._lender.arm()
        if self._inner_check is None:  # else the draw starts once `check_ranks` has run
            self._start()
        return batch

    def _check_ranks(self, all_gather: Callable[[Any], list[Any]]) -> None:
        """The wrapped source's `check_ranks` on the batch just handed out, then the next draw
        (none when the check raises: the run stops; a later `next_batch` starts it)."""
        assert self._inner_check is not None
        self._inner_check(all_gather)
        if self._inflight is None:
            self._start()

    def _start(self) -> None:
        if isinstance(self.source, StatefulBatchSource):
            self._state_before = self.source.state_dict()
        self._inflight = asyncio.run_coroutine_threadsafe(_draw(self.source), self._loop)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the batch in flight (if any) is drawn (its error is raised by the next
        `next_batch`, not here)."""
        inflight = self._inflight
        if inflight is not None:
            concurrent.futures.wait([inflight], timeout=timeout)

    def state_dict(self) -> JSON:
        if not isinstance(self.source, StatefulBatchSource):
            return {}
        return self._state_before if self._state_before is not None else self.source.state_dict()

    def load_state_dict(self, state: JSON) -> None:
        if self._inflight is not None:
            raise RuntimeError(
                "PrefetchBatchSource: load_state_dict after batches were drawn; restore the "
                "state (Trainer.resume) before the first step"
            )
        if isinstance(self.source, StatefulBatchSource):
            self.source.load_state_dict(state)

    def close(self, *clients: object) -> None:
        """Cancel the batch in flight (if any), close each of `clients` (`aclose()`, else
        `close()`) on this source's loop (an HTTP client the rollouts used holds connections
        bound to that loop, which no other loop can close) and stop the background thread."""
        closers: list[Callable[[], object]] = []
        for client in clients:
            close = getattr(client, "aclose", None) or getattr(client, "close", None)
            if close is None:
                raise TypeError(f"PrefetchBatchSource.close: {client!r} has no aclose() or close()")
            closers.append(close)
        self._unhook()
        self._lender.restore()
        if self._loop.is_closed():
            return
        self._inflight = None
        stopped = asyncio.run_coroutine_threadsafe(_cancel_all(closers), self._loop)
        stopped.result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


def prefetch_inside(source: object) -> PrefetchBatchSource | None:
    """The `PrefetchBatchSource` that `source` is or wraps, else None. A wrapper keeps what it
    wraps as `.source` (as `PrefetchBatchSource` and `ludic.recipes`' `SampleLog` and
    `ContextOverflowWatch` do), so the Trainer finds one under `log_samples(...)` too."""
    found = (s for s in wrapped_sources(source) if isinstance(s, PrefetchBatchSource))
    return next(found, None)


# lent threads are kept only while a layer takes less than this share of its time on the
# caller's own threads (the latest such layer of the same phase, forward or backward)
LENT_SPEEDUP = 0.9


class _ThreadLender:
    """Raises the torch thread count of the thread that `arm()`ed it, once, and puts it back.

    `torch.set_num_threads` sets the OpenMP count of the calling OS thread only (and torch's
    default for threads that have not run an op yet), so both the raise and the restore must
    run on the armed thread: calls from any other thread are ignored."""

    def __init__(self) -> None:
        self.owner: int | None = None
        self.base: int | None = None
        self.lent_at: float | None = None
        self.lent_seconds = 0.0
        self.dropped = False  # this step's lend did not speed the layers up
        self.backoff = 0  # steps to sit out after the next drop (doubles per drop, up to 16)
        self.skip = 0  # steps left to sit out
        self.sitting_out = False  # this step is one of them
        self.last: tuple[str, float] | None = None  # the previous look: phase, time
        self.reference: dict[str, float] = {}  # phase -> latest layer interval on own threads

    def arm(self) -> None:
        """A new step on the calling thread (its draw just started)."""
        self.owner = threading.get_ident()
        self.dropped, self.last, self.lent_seconds = False, None, 0.0
        self.sitting_out, self.skip = self.skip > 0, max(self.skip - 1, 0)

    def report(self) -> dict[str, float]:
        return {
            "prefetch_lent_seconds": self.lent_seconds,
            "prefetch_lend_dropped": float(self.dropped),
        }

    def look(self, phase: str, *, draw_done: bool, threads: int) -> None:
        """A layer boundary (`phase` "forward" or "backward") on some thread."""
        if threading.get_ident() != self.owner:
            return
        now = time.perf_counter()
        previous, self.last = self.last, (phase, now)
        if (
            previous is not None
            and previous[0] == phase
            and not self._judge(phase, now - previous[1])
        ):
            return
        if draw_done and self.lent_at is None and not self.dropped and not self.sitting_out:
            self.base = torch.get_num_threads()
            if threads > self.base:
                torch.set_num_threads(threads)
                self.lent_at = now

    def _judge(self, phase: str, interval: float) -> bool:
        """One layer's time: the reference on own threads; with lent threads, drop them unless
        it beat the reference by `LENT_SPEEDUP`. False when dropped."""
        if self.lent_at is None:
            self.reference[phase] = interval
            return True
        reference = self.reference.get(phase)
        if reference is None or interval < LENT_SPEEDUP * reference:
            self.backoff = 0
            return True
        self.restore()
        self.dropped = True
        self.backoff = min(2 * self.backoff or 1, 16)
        self.skip = self.backoff
        return False

    def restore(self) -> None:
        """Back to the count from before the lend (on the armed thread; else nothing)."""
        if self.lent_at is None or threading.get_ident() != self.owner:
            return
        assert self.base is not None
        torch.set_num_threads(self.base)
        self.lent_seconds += time.perf_counter() - self.lent_at
        self.lent_at = None


def _lend_count(lend: bool | int) -> int | None:
    if lend is False:
        return None
    if lend is True:
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    if not isinstance(lend, int) or lend < 1:
        raise ValueError(
            f"PrefetchBatchSource: lend_idle_threads={lend!r}; give True (the CPUs this process "
            "may use), False, or a thread count >= 1"
        )
    return lend


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    layers = [
        layer
        for module in model.modules()
        if isinstance(module, torch.nn.ModuleList)
        for layer in module
    ]
    return layers or [model]


def _first_grad_tensor(output: object) -> torch.Tensor | None:
    first = output[0] if isinstance(output, (tuple, list)) and output else output
    if isinstance(first, torch.Tensor) and first.requires_grad:
        return first
    return None


async def _cancel_all(closers: list[Callable[[], object]]) -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for close in closers:
        await maybe_await(close())


async def _draw(source: BatchSource) -> SAWBatch:
    started = time.perf_counter()
    batch: SAWBatch = await maybe_await(source.next_batch())
    stats = {**batch.stats, "prefetch_draw_seconds": time.perf_counter() - started}
    return replace(batch, stats=stats)
