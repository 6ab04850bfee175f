"""SandboxPool does not cache a run that hit the process cap: when not root, RLIMIT_NPROC
counts every process of the shared uid, so a fork refused while other sandboxes ran depends on
host load, like a wall-time timeout."""

from __future__ import annotations

from sandbox_backends import ScriptedBackend

from ludic.sandbox import SandboxPool, SandboxResult

FORK_TB = "Traceback (most recent call last):\n  ...\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n"


async def test_a_run_refused_a_fork_is_not_served_from_the_cache() -> None:
    refused = SandboxResult(stdout="", stderr=FORK_TB, exit_code=1)
    assert refused.processes_exceeded and not refused.timed_out
    ok = SandboxResult(stdout="forked\n", stderr="", exit_code=0)
    backend = ScriptedBackend(refused, ok, ok)
    pool = SandboxPool(backend)
    first = await pool.run_python("import os; os.fork()")
    second = await pool.run_python("import os; os.fork()")
    assert (first.limit_hit, first.cached) == ("processes", False)
    assert (second.stdout, second.cached) == ("forked\n", False)
    assert backend.runs == 2
    third = await pool.run_python("import os; os.fork()")  # a clean result is cached as before
    assert (third.stdout, third.cached, backend.runs) == ("forked\n", True, 2)
