"""Running one sandboxed process from asyncio: bounded output capture, wall-time kill, and
classification into a `SandboxResult`. Shared by every backend.

It deliberately knows nothing about isolation: the backend hands it a ready argv and a
`kill` coroutine that ends the whole sandbox (process tree, container, namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ludic.sandbox.records import SandboxLimits, SandboxResult, SandboxStartError, classify_exit

Killer = Callable[[asyncio.subprocess.Process], Awaitable[None]]

_CHUNK = 64 * 1024
_DRAIN_GRACE_S = 2.0  # after exit, how long leftover pipe holders may keep us waiting
_STDERR_SAID = 2000  # of a sandbox that failed to start, the end of its stderr in the error


@dataclass(slots=True)
class _Capture:
    data: bytearray
    truncated: bool = False


async def _read_capped(
    stream: asyncio.StreamReader | None, capture: _Capture, cap: int, overflow: asyncio.Event
) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK):
        room = cap - len(capture.data)
        if len(chunk) > room:  # keep draining to EOF (the kill is coming) so the pipe closes
            capture.data += chunk[: max(room, 0)]
            capture.truncated = True
            overflow.set()
        else:
            capture.data += chunk


async def _feed(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    if stream is None:
        return
    # A program that never reads its stdin, or dies early, is not an error.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            stream.write(data)
            await stream.drain()
        stream.close()
        await stream.wait_closed()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _exited(proc: asyncio.subprocess.Process) -> int:
    """The process's exit status, as soon as it exits. (`Process.wait()` also waits for its
    pipes to close, which a child left behind can hold open.)"""
    with contextlib.suppress(OSError):  # no pidfd (old kernel, already reaped): poll below
        fd = os.pidfd_open(proc.pid)
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    while proc.returncode is None:  # the child watcher reaps it a moment later
        await asyncio.sleep(0.002)
    return proc.returncode


async def _said_on_stderr(proc: asyncio.subprocess.Process) -> str:
    """The end of what a process that never ran its program wrote to stderr (its launcher's
    reason, such as bwrap's), without waiting for more."""
    if proc.stderr is None:
        return ""
    with contextlib.suppress(TimeoutError, OSError):
        data = await asyncio.wait_for(proc.stderr.read(_STDERR_SAID), _DRAIN_GRACE_S)
        return data.decode("utf-8", errors="replace").strip()[-_STDERR_SAID:]
    return ""


async def kill_process_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group led by `proc` (it was started with a new session).

    Signals go through `os` rather than `proc.kill()`, which polls and so may reap the
    process before asyncio's child watcher sees its status.
    """
    if proc.returncode is not None:  # reaped: the pid may belong to someone else by now
        return
    for send in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(proc.pid, signal.SIGKILL)


async def run_contained(
    argv: Sequence[str],
    *,
    stdin: bytes,
    limits: SandboxLimits,
    isolation: str,
    kill: Killer = kill_process_group,
    cleanup: Killer | None = None,
    on_start: Killer | None = None,
    signal_as_128_plus: bool = False,
    memory_scope: str = "",
    env: Mapping[str, str] | None = None,
    popen_kwargs: Mapping[str, Any] | None = None,
) -> SandboxResult:
    """Run `argv` to completion or until a limit, and describe what happened.

    `kill` ends the sandbox on a wall timeout, an output overflow or cancellation; `cleanup`
    (default: `kill`) runs after every exit so no stray process outlives the run. `on_start`
    runs as soon as the process exists (e.g. to move it into a cgroup and open its gate); if
    it raises, the sandbox is killed and the error propagates.
    """
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=dict(env) if env is not None else {},
        **dict(popen_kwargs or {}),
    )
    if on_start is not None:
        try:
            await on_start(proc)
        except BaseException as exc:
            await kill(proc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), _DRAIN_GRACE_S)
            said = await _said_on_stderr(proc) if isinstance(exc, Exception) else ""
            if said:  # e.g. bwrap could not create its namespaces: that, not the cgroup, is why
                raise SandboxStartError(
                    f"the sandbox did not start: {exc}; its process ended (status "
                    f"{proc.returncode}, negative: killed by that signal) saying: {said}"
                ) from exc
            raise
    overflow = asyncio.Event()
    captures = (_Capture(data=bytearray()), _Capture(data=bytearray()))
    readers = [
        asyncio.create_task(_read_capped(stream, capture, limits.max_output_bytes, overflow))
        for stream, capture in zip((proc.stdout, proc.stderr), captures, strict=True)
    ]
    feeder = asyncio.create_task(_feed(proc.stdin, stdin))
    exited = asyncio.create_task(_exited(proc))
    overflowed = asyncio.create_task(overflow.wait())
    killed = False
    try:
        done, _ = await asyncio.wait(
            {exited, overflowed}, timeout=limits.wall_time_s, return_when=asyncio.FIRST_COMPLETED
        )
        timed_out = not done
        if exited not in done:
            killed = True
            await kill(proc)
        returncode = await exited
        duration = time.monotonic() - start
        await (cleanup or kill)(proc)
        # A process that escaped the kill could hold the pipes open: wait briefly, then keep
        # what was read so far.
        _, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE_S)
        for task, capture in zip(readers, captures, strict=True):
            capture.truncated |= task in pending
        if proc.stdin is not None:
            proc.stdin.close()
        if not pending:  # let the transport finish, so nothing is left for the GC to close
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), _DRAIN_GRACE_S)
    finally:
        overflowed.cancel()
        feeder.cancel()
        if proc.returncode is None:  # cancelled from outside: take the sandbox down with us
            await kill(proc)
        exited.cancel()
        for task in readers:
            task.cancel()
    stdout, stderr = (c.data.decode("utf-8", errors="replace") for c in captures)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        output_truncated=any(c.truncated for c in captures),
        duration_s=duration,
        isolation=isolation,
        memory_scope=memory_scope,
        **classify_exit(
            returncode,
            stderr,
            limits=limits,
            duration_s=duration,
            killed_by_runner=killed,
            signal_as_128_plus=signal_as_128_plus,
        ),
    )
