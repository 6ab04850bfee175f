"""SandboxPool: result cache (hits, LRU bound, keys), in-flight sharing, the concurrency
limit, and backend detection with its fallback."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sandbox_backends import EchoBackend

from ludic.sandbox import (
    BubblewrapBackend,
    RestrictedSubprocessBackend,
    SandboxLimits,
    SandboxPool,
    cache_key,
    detect_backend,
    shared_pool,
)


async def test_identical_runs_hit_the_cache() -> None:
    backend = EchoBackend()
    pool = SandboxPool(backend)
    first = await pool.run_python("print(1)", stdin="a")
    second = await pool.run_python("print(1)", stdin="a")
    other = await pool.run_python("print(1)", stdin="b")
    assert (first.cached, second.cached, other.cached) == (False, True, False)
    assert second.stdout == first.stdout == "a" and other.stdout == "b"
    assert (pool.hits, pool.misses, backend.runs) == (1, 2, 2)


async def test_cache_is_lru_bounded() -> None:
    backend = EchoBackend()
    pool = SandboxPool(backend, cache_size=2)
    for stdin in ("a", "b", "a", "c"):  # "b" is least recently used when "c" arrives
        await pool.run_python("x", stdin=stdin)
    assert backend.runs == 3
    await pool.run_python("x", stdin="a")
    assert backend.runs == 3
    await pool.run_python("x", stdin="b")
    assert backend.runs == 4


async def test_cache_can_be_bypassed_and_disabled() -> None:
    backend = EchoBackend()
    pool = SandboxPool(backend)
    await pool.run_python("x")
    await pool.run_python("x", use_cache=False)
    off = SandboxPool(backend, cache_size=0)
    await off.run_python("x")
    await off.run_python("x")
    assert backend.runs == 4


async def test_wall_time_outcomes_are_not_cached() -> None:
    backend = EchoBackend(timed_out=True)
    pool = SandboxPool(backend)
    await pool.run_python("while True: pass")
    await pool.run_python("while True: pass")
    assert backend.runs == 2


async def test_identical_runs_in_flight_share_one_execution() -> None:
    backend = EchoBackend(delay_s=0.05)
    pool = SandboxPool(backend)
    results = await asyncio.gather(*(pool.run_python("x", stdin="s") for _ in range(3)))
    assert backend.runs == 1
    assert sorted(r.cached for r in results) == [False, True, True]


async def test_a_cancelled_caller_does_not_cancel_a_shared_run() -> None:
    backend = EchoBackend(delay_s=0.05)
    pool = SandboxPool(backend)
    first = asyncio.create_task(pool.run_python("x"))
    second = asyncio.create_task(pool.run_python("x"))
    await asyncio.sleep(0.01)
    first.cancel()
    assert (await second).stdout == "" and backend.runs == 1


async def test_concurrency_is_limited() -> None:
    backend = EchoBackend(delay_s=0.02)
    pool = SandboxPool(backend, max_concurrency=2)
    await asyncio.gather(*(pool.run_python("x", stdin=str(i)) for i in range(7)))
    assert backend.runs == 7 and backend.peak == 2


def test_cache_key_covers_everything_that_decides_a_run() -> None:
    limits = SandboxLimits()
    base = cache_key(["p", "main.py"], {"main.py": b"x"}, b"in", limits, "bubblewrap")
    assert base == cache_key(["p", "main.py"], {"main.py": b"x"}, b"in", limits, "bubblewrap")
    variants = [
        cache_key(["p", "other.py"], {"main.py": b"x"}, b"in", limits, "bubblewrap"),
        cache_key(["p", "main.py"], {"main.py": b"y"}, b"in", limits, "bubblewrap"),
        cache_key(["p", "main.py"], {"main.py": b"x"}, b"in2", limits, "bubblewrap"),
        cache_key(
            ["p", "main.py"], {"main.py": b"x"}, b"in", SandboxLimits(cpu_time_s=1), "bubblewrap"
        ),
        cache_key(["p", "main.py"], {"main.py": b"x"}, b"in", limits, "subprocess"),
    ]
    assert len({base, *variants}) == 6


def test_pool_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        SandboxPool(EchoBackend(), max_concurrency=0)
    with pytest.raises(ValueError, match="cache_size"):
        SandboxPool(EchoBackend(), cache_size=-1)


async def test_detect_backend_prefers_bubblewrap_when_it_works() -> None:
    if await BubblewrapBackend().probe() is not None:
        pytest.skip("bubblewrap does not work here")
    backend = await detect_backend(use_cached=False)
    assert isinstance(backend, BubblewrapBackend)
    assert await detect_backend() is await detect_backend()
    result = await SandboxPool().run_python("print(6 * 7)")
    assert result.stdout == "42\n" and result.isolation == "bubblewrap"


async def test_detect_backend_falls_back_to_the_weaker_subprocess(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(self: BubblewrapBackend) -> str:
        return "user namespaces are disabled"

    monkeypatch.setattr(BubblewrapBackend, "probe", broken)
    monkeypatch.setattr("ludic.sandbox.restricted._warned", False)
    with caplog.at_level(logging.WARNING, logger="ludic.sandbox"):
        backend = await detect_backend(use_cached=False)
    assert isinstance(backend, RestrictedSubprocessBackend)
    assert "weaker" in caplog.text
    result = await SandboxPool(backend).run_python("print('fallback')")
    assert result.stdout == "fallback\n" and result.isolation == "subprocess"
    with pytest.raises(RuntimeError, match="user namespaces are disabled"):
        await detect_backend(allow_weak=False, use_cached=False)


async def test_shared_pool_is_one_per_event_loop() -> None:
    pool = shared_pool()
    assert shared_pool() is pool and pool.max_concurrency >= 1
