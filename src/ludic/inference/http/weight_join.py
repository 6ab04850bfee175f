"""How the weight receiver (`weight_receiver.WeightSyncReceiver`) joins the trainer's process
group: `InitRequest` (what `/ludic/weights/init` takes), `join_in_background(req)` starts the join (the trainer's TCPStore, then the group) on a
daemon thread and returns a future of the `Link`, failed with a `TimeoutError` naming the store
if the join has not completed `req.timeout_s` after it started; `in_background(fn, ...)` is
the daemon-thread future (with an optional deadline) it is built on, also used for pushes.

Daemon threads, so a join blocked in c10d on an unreachable trainer never delays the server's
exit. It does not cancel a join that ran past its deadline (c10d offers no way to: the thread
is abandoned, and what it returns later is dropped), retry a join, record errors for
`/ludic/weights/status` (the receiver does), or receive any weights.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
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


def join_in_background(req: InitRequest) -> Future[Link]:
    """Join the group `req` names on a daemon thread; the future fails with a `TimeoutError`
    naming the trainer's store if that takes longer than `req.timeout_s`."""

    def join() -> Link:
        store = join_store(req.host, req.port, world_size=req.world_size, timeout_s=req.timeout_s)
        group = open_group(
            store,
            rank=req.rank,
            world_size=req.world_size,
            backend=req.backend,
            timeout_s=req.timeout_s,
        )
        return Link(group, store)

    return in_background(
        join,
        name="ludic-weights-join",
        timeout_s=req.timeout_s,
        timeout=lambda: TimeoutError(
            f"the join did not complete within timeout_s={req.timeout_s:g} s "
            f"({describe_store(req)} is unreachable, or the trainer never opened its group)"
        ),
    )


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
