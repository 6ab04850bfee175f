"""Helpers for engine tests: admit a set of requests into one decode batch."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ludic.inference import ChatRequest
from ludic.inference.embedded.engine import EmbeddedEngine


async def admitted_together(
    engine: EmbeddedEngine, requests: list[ChatRequest], *, return_exceptions: bool = False
) -> list[Any]:
    """Complete `requests` admitted in one batch: the engine thread is held while they queue.
    With `return_exceptions`, a failed request's exception takes its place."""
    entered, gate = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait()

    held = asyncio.get_running_loop().run_in_executor(None, engine._call_on_worker, hold)
    await asyncio.to_thread(entered.wait, 60)
    tasks = [asyncio.ensure_future(engine.complete(r)) for r in requests]
    while len(engine._pending) < len(requests):
        await asyncio.sleep(0.01)
    gate.set()
    await held
    gathered = asyncio.gather(*tasks, return_exceptions=return_exceptions)
    return list(await asyncio.wait_for(gathered, 120))
