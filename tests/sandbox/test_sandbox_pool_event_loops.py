"""A SandboxPool used under one `asyncio.run` and then another, as the README's block does
(`asyncio.run(pool.run_python(...))`, then the pool given to an env that later episodes run
on): every run that waited for a slot under the second loop failed with "Semaphore ... is
bound to a different event loop". Two loops running at once are refused, naming the fix."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sandbox_backends import EchoBackend

from ludic.sandbox import SandboxPool


async def _batch(pool: SandboxPool, tag: str) -> list[str]:
    results = await asyncio.gather(*(pool.run_python("x", stdin=f"{tag}{i}") for i in range(5)))
    return [r.stdout for r in results]


def test_a_pool_serves_one_event_loop_after_another() -> None:
    backend = EchoBackend()
    pool = SandboxPool(backend, max_concurrency=2)  # 5 runs: 3 wait for a slot in each loop
    assert asyncio.run(_batch(pool, "a")) == [f"a{i}" for i in range(5)]
    assert asyncio.run(_batch(pool, "b")) == [f"b{i}" for i in range(5)]
    assert asyncio.run(_batch(pool, "a")) == [f"a{i}" for i in range(5)]  # the cache stays
    assert backend.runs == 10


def test_a_pool_in_use_by_a_running_loop_refuses_another() -> None:
    pool = SandboxPool(EchoBackend())
    started, release = threading.Event(), threading.Event()

    async def hold_the_pool() -> None:
        await pool.run_python("x")
        started.set()
        await asyncio.to_thread(release.wait)

    holder = threading.Thread(target=asyncio.run, args=(hold_the_pool(),))
    holder.start()
    try:
        assert started.wait(30)
        with pytest.raises(RuntimeError, match=r"another running event loop.*its own SandboxPool"):
            asyncio.run(pool.run_python("y"))
    finally:
        release.set()
        holder.join(30)
    assert asyncio.run(pool.run_python("y")).exit_code == 0  # that loop ended: this one may
