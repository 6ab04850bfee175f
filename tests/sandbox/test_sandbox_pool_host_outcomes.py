"""A run ended by a signal no limit explains is not cached: the signal may come from outside
the program (the host's OOM killer, an operator, a sandbox process killed mid-batch). The
pool cached such a crash, so every later identical run (the rest of a GRPO group writing the
same program, the next epoch) got the crash again without running."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from sandbox_backends import TEST_LIMITS, ScriptedBackend, get_backend

from ludic.sandbox import SandboxPool, SandboxResult

KILLED = SandboxResult(stdout="", stderr="", exit_code=None, killed_signal=signal.SIGKILL)
DONE = SandboxResult(stdout="3\n", stderr="", exit_code=0)


async def test_an_unexplained_signal_death_runs_again() -> None:
    backend = ScriptedBackend(KILLED, DONE)
    pool = SandboxPool(backend)
    first = await pool.run_python("print(3)")
    second = await pool.run_python("print(3)")
    assert (first.killed_signal, second.stdout, second.cached) == (signal.SIGKILL, "3\n", False)
    assert (await pool.run_python("print(3)")).cached  # a clean result is cached as before


@pytest.mark.parametrize(
    "outcome",
    [
        SandboxResult(
            stdout="", stderr="", exit_code=None, killed_signal=24, cpu_time_exceeded=True
        ),
        SandboxResult(stdout="", stderr="", exit_code=None, killed_signal=9, memory_exceeded=True),
        SandboxResult(stdout="", stderr="ZeroDivisionError", exit_code=1),
    ],
    ids=["cpu_time", "memory", "exit_1"],
)
async def test_a_death_a_limit_explains_stays_cached(outcome: SandboxResult) -> None:
    backend = ScriptedBackend(outcome)
    pool = SandboxPool(backend)
    await pool.run_python("x")
    assert (await pool.run_python("x")).cached and backend.runs == 1


def _kill_sandboxed_script(marker: str) -> bool:
    """SIGKILL the sandboxed program whose source holds `marker` (from outside, as root)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd_file = entry / "cwd" / "main.py"
            if argv[-2:] != [b"main.py", b""] or marker not in cwd_file.read_text():
                continue
        except OSError:
            continue
        os.kill(int(entry.name), signal.SIGKILL)
        return True
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="killing a sandbox's process from outside needs root")
async def test_a_sandbox_killed_from_outside_is_run_again() -> None:
    pool = SandboxPool(await get_backend("bubblewrap"), limits=TEST_LIMITS)
    marker = f"killed-from-outside-{os.getpid()}-{time.monotonic_ns()}"
    code = f"import time  # {marker}\ntime.sleep(3)\nprint('done')\n"
    first = asyncio.ensure_future(pool.run_python(code))
    for _ in range(300):
        await asyncio.sleep(0.05)
        if await asyncio.to_thread(_kill_sandboxed_script, marker):
            break
    crashed = await first
    assert (crashed.killed_signal, crashed.limit_hit) == (signal.SIGKILL, None)
    again = await pool.run_python(code)
    assert (again.stdout, again.cached) == ("done\n", False)
