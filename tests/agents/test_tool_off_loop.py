"""Sync tools run on a worker thread: a tool that blocks holds its own episode only, and the
engine's episode timeout bounds it; async tools run on the loop."""

from __future__ import annotations

import asyncio
import json
import logging
import threading

import pytest

from ludic._log_once import forget_warnings
from ludic.agents.tools import execute_tool, tool_from_callable
from ludic.types import ToolCall


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=json.dumps(arguments))


async def test_a_blocking_sync_tool_leaves_the_loop_free() -> None:
    released = threading.Event()

    def wait_for_release() -> str:
        """Block until the loop releases us (it cannot while we hold it)."""
        return "released" if released.wait(timeout=30) else "the loop was blocked"

    async def release_soon() -> None:
        await asyncio.sleep(0)
        released.set()

    result, _ = await asyncio.gather(
        execute_tool(tool_from_callable(wait_for_release), call("wait_for_release")),
        release_soon(),
    )
    assert result.content == "released" and not result.is_error


async def test_sync_tools_run_off_the_loop_thread_and_async_ones_on_it() -> None:
    threads: dict[str, int] = {}

    def sync_tool() -> str:
        """Record the thread."""
        threads["sync"] = threading.get_ident()
        return "s"

    async def async_tool() -> str:
        """Record the thread."""
        threads["async"] = threading.get_ident()
        return "a"

    for fn in (sync_tool, async_tool):
        result = await execute_tool(tool_from_callable(fn), call(fn.__name__))
        assert not result.is_error
    assert threads["async"] == threading.get_ident() != threads["sync"]


async def test_a_failing_tool_is_logged_once_per_exception_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # e.g. a sqlite3 connection made on the main thread, used from the tool's worker thread
    forget_warnings()
    made_on = threading.get_ident()

    def query(sql: str) -> str:
        """Run `sql` on a connection bound to the thread that made it."""
        if threading.get_ident() != made_on:
            raise RuntimeError(f"objects created in a thread can only be used there ({sql})")
        return "[[42]]"

    tool = tool_from_callable(query)
    with caplog.at_level(logging.WARNING, logger="ludic.agents.tools"):
        results = [await execute_tool(tool, call("query", sql=f"q{i}")) for i in range(3)]
    assert all(r.is_error and "RuntimeError" in r.content for r in results)
    (record,) = [r.getMessage() for r in caplog.records]
    assert record.startswith("tool 'query' raised RuntimeError") and "async def" in record
