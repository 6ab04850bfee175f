"""Curriculum building block: a `requests_fn` that pops dataset items from a queue and turns
each into a `RolloutRequest`. It does not expand groups (that is the source's strategy) and
does not refill the queue (a producer thread, or the caller, does).
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import TypeVar

from ludic.rollouts import RolloutRequest
from ludic.training.batching.types import BatchSourceExhausted

Item = TypeVar("Item")


class RequestsExhausted(BatchSourceExhausted):
    """The queue was empty when a batch of requests was asked for."""


def make_requests_fn_from_queue(
    items: queue.Queue[Item],
    *,
    batch_size: int,
    build_request: Callable[[Item], RolloutRequest],
    drop_last: bool = False,
) -> Callable[[], list[RolloutRequest]]:
    """A `requests_fn` taking up to `batch_size` items from `items` per call (never blocking).

    A call that finds the queue empty raises `RequestsExhausted` (the Trainer then stops). A
    call that finds fewer than `batch_size` items returns them, or with `drop_last=True` puts
    them back and raises.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    def requests_fn() -> list[RolloutRequest]:
        taken: list[Item] = []
        while len(taken) < batch_size:
            try:
                taken.append(items.get_nowait())
            except queue.Empty:
                break
        if not taken or (drop_last and len(taken) < batch_size):
            for item in taken:  # give them back so the data is not lost
                items.put(item)
            raise RequestsExhausted(
                f"the request queue held {len(taken)} items, {batch_size} were needed"
            )
        return [build_request(item) for item in taken]

    return requests_fn
