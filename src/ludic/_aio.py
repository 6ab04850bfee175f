"""Small async helpers shared across packages (not public API).

`run_in_worker` runs a blocking call on a daemon worker thread so that the event loop (and every
other episode on it) keeps going and a timeout around the await can fire. It cannot stop the
call itself: an abandoned call runs on until it returns, which is logged. Code that holds the
GIL without releasing it (a C extension, a catastrophic `re` match) still stalls the loop;
only a separate process could bound that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

logger = logging.getLogger(__name__)

_IDLE_EXIT_S = 30.0


async def maybe_await(value: T | Awaitable[T]) -> T:
    """Await `value` if it is awaitable, so sync and async implementations share one call site."""
    if inspect.isawaitable(value):
        return await value
    return value


class _DaemonWorkers:
    """A grow-on-demand pool of daemon threads.

    Why not `asyncio.to_thread`: its executor's threads are joined at loop shutdown and at
    interpreter exit, so one env step that never returns would hang `asyncio.run()` and the
    process after the batch has long moved on. Daemon threads do not; idle ones exit after
    `_IDLE_EXIT_S`.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]]]
        self._jobs = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one token per idle worker
        self._lock = threading.Lock()
        self.abandoned = 0  # calls whose awaiter gave up while they still ran

    def submit(self, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((future, call))
        if not self._idle.acquire(blocking=False):
            threading.Thread(target=self._work, name="ludic-worker", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            try:
                future, call = self._jobs.get(timeout=_IDLE_EXIT_S)
            except queue.Empty:
                if self._idle.acquire(blocking=False):
                    return  # took our own idle token back: no job is promised to us
                continue  # a submitter counted on us: a job is on its way
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # handed to the awaiter, not lost in this thread
                    future.set_exception(exc)
            self._idle.release()

    def note_abandoned(self, name: str, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self.abandoned += 1
            running = self.abandoned
        logger.warning(
            "%s was abandoned (timeout or cancellation) while running on a worker thread; the "
            "thread keeps running until it returns (%d abandoned call(s) still running)",
            name,
            running,
        )
        future.add_done_callback(lambda _: self._forget())

    def _forget(self) -> None:
        with self._lock:
            self.abandoned -= 1


_WORKERS = _DaemonWorkers()


def _fresh_workers_after_fork() -> None:
    # A forked child inherits the idle count but not the threads: start from an empty pool.
    global _WORKERS
    _WORKERS = _DaemonWorkers()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_workers_after_fork)


def abandoned_worker_calls() -> int:
    """How many calls given up on by their awaiter are still running on worker threads."""
    return _WORKERS.abandoned


async def run_in_worker(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking `fn(*args, **kwargs)` on a worker thread and await its result.

    Context variables are copied to the thread. Cancelling the await (a timeout) returns at
    once; the call itself runs on to completion (logged as abandoned).
    """
    context = contextvars.copy_context()
    call = functools.partial(context.run, fn, *args, **kwargs)
    future = _WORKERS.submit(call)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        if future.running():
            _WORKERS.note_abandoned(_call_name(fn), future)
        raise


def _call_name(fn: Callable[..., Any]) -> str:
    """`Class.method` of the instance's own class for a bound method (an env subclass, not the
    base class defining the method), else the qualified name."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type) and hasattr(fn, "__name__"):
        return f"{type(owner).__name__}.{fn.__name__}"
    return getattr(fn, "__qualname__", repr(fn))


async def call_off_loop(fn: Callable[..., T | Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
    """Call a sync-or-async callable without blocking the event loop.

    A coroutine function is awaited on the loop. Anything else runs on a worker thread (so a
    blocking env step is bounded by the episode timeout), and an awaitable it returns is then
    awaited on the loop.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)  # type: ignore[no-any-return]
    return await maybe_await(await run_in_worker(fn, *args, **kwargs))
