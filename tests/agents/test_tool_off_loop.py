"""Sync tools run on a worker thread: a tool that blocks holds its own episode only, and the
engine's episode timeout bounds it; async tools run on the loop."""

from __future__ import annotations

import asyncio
import json
import threading

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
