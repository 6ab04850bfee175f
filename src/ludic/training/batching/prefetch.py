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

Checkpoints: `state_dict()` is the wrapped source's state from before the batch in flight was
drawn, so a resumed run draws that batch again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

from ludic._aio import maybe_await
from ludic.training.batching.types import BatchSource, SAWBatch, StatefulBatchSource
from ludic.types import JSON


class PrefetchBatchSource:
    """Keeps one batch of `source` in flight on a background thread; `close()` when done."""

    def __init__(self, source: BatchSource) -> None:
        self.source = source
        self._loop = asyncio.new_event_loop()  # one loop for every draw: sources may bind to it
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ludic-prefetch", daemon=True
        )
        self._thread.start()
        self._inflight: Future[SAWBatch] | None = None
        self._state_before: JSON | None = None  # the source's state before the batch in flight

    async def next_batch(self) -> SAWBatch:
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
        self._start()
        return batch

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
        if self._loop.is_closed():
            return
        self._inflight = None
        stopped = asyncio.run_coroutine_threadsafe(_cancel_all(closers), self._loop)
        stopped.result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


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
