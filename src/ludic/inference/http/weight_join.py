"""How the weight receiver (`weight_receiver.WeightSyncReceiver`) joins the trainer's process
group: `InitRequest` (what `/ludic/weights/init` takes), `join_in_background(req)` starts the join (the trainer's TCPStore, then the group) on a
daemon thread and returns a future of the `Link`, failed with a `TimeoutError` naming the store
if the join has not completed `req.timeout_s` after it started; `in_background(fn, ...)` is
the daemon-thread future (with an optional deadline) it is built on, also used for pushes.

Daemon threads, so a join blocked on an unreachable trainer never delays the server's exit.
Until the trainer's store accepts a connection the join waits in Python (a TCP probe), never in
c10d: cancelling its future (`Future.cancel()`: the receiver does, when a newer `/init` or a
`/close` abandons the join) or its deadline ends it at once. Once the store answers, the join
is inside c10d, which offers no way to cancel it: an abandoned one runs until it returns (at
most `req.timeout_s`; a store that accepts and never answers: for ever), and what it returns
is dropped. At interpreter exit the joins still probing are stopped and waited for, and one
inside c10d whose timeout is seconds away is waited for until it returns: a daemon thread
coming back from c10d while the interpreter finalizes aborts the process ("terminate called
without an active exception", exit 134). It does not retry a join, record errors for `/ludic/weights/status`
(the receiver does), or receive any weights.
"""

from __future__ import annotations

import atexit
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from ludic.distributed.transfer import Collective, join_store, open_group
from ludic.inference.http.weight_tenure import TrainerInfo

T = TypeVar("T")
MAX_JOIN_TIMEOUT_S = 7 * 24 * 3600.0


class InitRequest(BaseModel):
    """Where the trainer's TCPStore listens, how to build the group, and how pushes are driven:
    `control` "http" (`/start` + `/finish` requests) or "store" (`ludic.distributed.control`:
    the same steps as keys in the trainer's store, no HTTP per push)."""

    host: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)
    backend: Literal["gloo", "nccl"] = "gloo"
    world_size: int = Field(default=2, ge=2)
    rank: int = Field(default=1, ge=1)
    # finite and at most a week: an inf (or a timestamp past time_t) killed the join's timer
    # thread with an OverflowError traceback, and the join then never timed out
    timeout_s: float = Field(default=120.0, gt=0, le=MAX_JOIN_TIMEOUT_S, allow_inf_nan=False)
    control: Literal["http", "store"] = "http"
    trainer: TrainerInfo | None = None  # who joins (older trainers do not say)


@dataclass(slots=True)
class Link:
    """A joined group and the trainer's store it was built on. `release()` drops the group."""

    group: Collective | None
    store: Any

    def release(self) -> None:
        """Drop this process's reference to the group. c10d closes a group's connections
        only when the object is freed (`abort()` and `shutdown()` leave them open), so the
        trainer that built it then fails its next broadcast at once instead of at its
        timeout. A receive in flight holds its own reference: the receiver ends it first
        (`transfer.Cancel`), and what it posted drains on a thread that frees the group."""
        self.group = None

    def joined(self) -> Collective:
        """The group; raises RuntimeError once released."""
        if self.group is None:
            raise RuntimeError("this weight-sync group was left (a newer one replaced it)")
        return self.group


def link_status(link: Future[Link] | None) -> dict[str, Any]:
    """What `GET /ludic/weights/status` says of the join `link` (None: no group held):
    `connected`, `joining`, and `join_error` when it failed."""
    failed = link.exception() if link is not None and link.done() else None
    return {
        "connected": link is not None and link.done() and failed is None,
        "joining": link is not None and not link.done(),
        "join_error": None if failed is None else f"{type(failed).__name__}: {failed}",
    }


def join_in_background(req: InitRequest) -> Future[Link]:
    """Join the group `req` names on a daemon thread; the future fails with a `TimeoutError`
    naming the trainer's store if that takes longer than `req.timeout_s`. Cancel the future
    (`future.cancel()`) to abandon the join: one still waiting for the store ends at once."""
    deadline = time.monotonic() + req.timeout_s
    over = threading.Event()  # set once the future is settled: cancelled or timed out

    def join() -> Link:
        me, pending = threading.current_thread(), _Pending(over, deadline)
        with _PENDING_LOCK:  # stopped and waited for at exit: `_at_exit`
            _PENDING[me] = pending
        try:
            _reach(req, deadline, over)  # cancellable: never in c10d before the store answers
            pending.in_c10d = True
            store = join_store(
                req.host, req.port, world_size=req.world_size, timeout_s=req.timeout_s
            )
            group = open_group(
                store,
                rank=req.rank,
                world_size=req.world_size,
                backend=req.backend,
                timeout_s=req.timeout_s,
            )
            return Link(group, store)
        finally:
            with _PENDING_LOCK:
                _PENDING.pop(me, None)

    future = in_background(
        join,
        name="ludic-weights-join",
        timeout_s=req.timeout_s,
        timeout=lambda: TimeoutError(
            f"the join did not complete within timeout_s={req.timeout_s:g} s "
            f"({describe_store(req)} is unreachable, or the trainer never opened its group)"
        ),
    )
    future.add_done_callback(lambda _: over.set())
    return future


# How long one TCP probe of the trainer's store may take (an unreachable host drops the SYN),
# and the pause between two probes refused at once (nothing listening yet).
_PROBE_S = 0.25
_RETRY_S = 0.05


class JoinAbandoned(RuntimeError):
    """The join's future was settled (cancelled, or timed out) before the store answered."""


def _reach(req: InitRequest, deadline: float, over: threading.Event) -> None:
    """Return once the trainer's store accepts a TCP connection; raises `JoinAbandoned` once
    `over` is set, `TimeoutError` at `deadline`. A plain socket (closed at once), so that an
    abandoned join, or one pending at exit, never waits in c10d for a store that is not there."""
    while not over.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{describe_store(req)} did not accept a connection in time")
        try:
            with socket.create_connection((req.host, req.port), timeout=min(left, _PROBE_S)):
                return
        except OSError:
            over.wait(min(_RETRY_S, max(0.0, deadline - time.monotonic())))
    raise JoinAbandoned(f"the join via {describe_store(req)} was abandoned")


def join_failed(error: BaseException, where: str | None = None) -> str:
    """What a server says of a join (via `where`, e.g. `describe_store(req)`) that failed."""
    via = "" if where is None else f" via {where}"
    return (
        f"could not join the trainer's process group{via} ({type(error).__name__}: {error}); "
        "POST /ludic/weights/init again"
    )


def describe_store(req: InitRequest) -> str:
    """The trainer's store `req` joins, for error messages."""
    return f"the trainer's store at {req.host}:{req.port}"


def in_background(
    fn: Callable[[], T],
    *,
    name: str,
    timeout_s: float | None = None,
    timeout: Callable[[], Exception] | None = None,
) -> Future[T]:
    """`fn()` on a daemon thread (one blocked in c10d on an unreachable trainer must not keep
    the process from exiting). With `timeout_s`, the future fails with `timeout()` then if
    `fn` has not returned (`fn` is abandoned; what it returns later is dropped)."""
    future: Future[T] = Future()
    lock = threading.Lock()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        with lock:
            if future.done():
                return
            # a `future.cancel()` racing with this wins: what `fn` gave is dropped
            with contextlib.suppress(InvalidStateError):
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)

    def run() -> None:
        try:
            result = fn()
        except BaseException as e:  # handed to whoever waits on the future
            settle(error=e)
        else:
            settle(result=result)

    threading.Thread(target=run, name=name, daemon=True).start()
    if timeout_s is not None:
        make = timeout or (lambda: TimeoutError(f"{name} did not finish in {timeout_s:g} s"))
        timer = threading.Timer(timeout_s, lambda: settle(error=make()))
        timer.daemon = True
        timer.start()
        future.add_done_callback(lambda _: timer.cancel())
    return future


@dataclass(slots=True)
class _Pending:
    """A join's thread still running: `over` stops its probe; `in_c10d` once the store answered."""

    over: threading.Event
    deadline: float  # time.monotonic() at its timeout_s
    in_c10d: bool = False


_PENDING: dict[threading.Thread, _Pending] = {}
_PENDING_LOCK = threading.Lock()
# At exit, a join inside c10d is waited for only if its timeout falls within this many seconds
# (it is about to come back, into the finalizing interpreter), and then until this long past it.
_EXIT_GRACE_S = 2.0


@atexit.register
def _at_exit() -> None:
    """Stop the joins still running and wait for their threads: one still probing its store
    ends at once; one inside c10d is waited for if its timeout is near (c10d returns then: a
    daemon thread coming back from c10d while the interpreter finalizes aborts the process).
    One whose timeout is far off is left: c10d may block past it (a store that accepts and
    never answers), and it cannot come back before the process is gone."""
    with _PENDING_LOCK:
        pending = list(_PENDING.items())
    for _, join in pending:
        join.over.set()
    for thread, join in pending:
        while thread.is_alive() and not join.in_c10d:
            thread.join(_PROBE_S)
        left = join.deadline - time.monotonic()
        if thread.is_alive() and left <= _EXIT_GRACE_S:
            thread.join(max(left, 0.0) + _EXIT_GRACE_S)
