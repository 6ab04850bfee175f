"""The process-count and file-size caps are reported as limit kinds ("processes", "file_size"),
by hand and on every backend this machine runs (bubblewrap, the restricted subprocess)."""

from __future__ import annotations

import signal

import pytest
from sandbox_backends import BACKEND_NAMES, MiB, get_backend, run_python

from ludic.sandbox import SandboxBackend, SandboxLimits, SandboxResult

FORK_TB = "Traceback (most recent call last):\n  ...\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n"
EFBIG_TB = "Traceback (most recent call last):\n  ...\nOSError: [Errno 27] File too large\n"


def result(stderr: str = "", exit_code: int | None = 1, **kw: object) -> SandboxResult:
    return SandboxResult(stdout="", stderr=stderr, exit_code=exit_code, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "stderr",
    [
        FORK_TB,
        "Traceback ...\n    _start_new_thread(self._bootstrap, ())\nRuntimeError: can't start new thread\n",
        "/bin/sh: 0: Cannot fork\n",
        "bash: fork: retry: Resource temporarily unavailable\n",
    ],
)
def test_a_refused_fork_or_thread_is_the_processes_limit(stderr: str) -> None:
    r = result(stderr)
    assert r.processes_exceeded and r.limit_hit == "processes" and not r.ok


def test_a_refused_write_or_sigxfsz_is_the_file_size_limit() -> None:
    assert result(EFBIG_TB).limit_hit == "file_size"
    assert result("File size limit exceeded\n").limit_hit == "file_size"
    killed = result(exit_code=None, killed_signal=signal.SIGXFSZ)
    assert killed.file_size_exceeded and killed.limit_hit == "file_size"


def test_a_program_that_copes_and_exits_zero_hit_no_limit() -> None:
    for stderr in (FORK_TB, EFBIG_TB):
        r = result(stderr, exit_code=0)
        assert r.limit_hit is None and r.ok
    assert result("print('File too large')\n").limit_hit is None  # not the error line it names


def test_definite_limits_come_first() -> None:
    assert result(FORK_TB, timed_out=True).limit_hit == "wall_time"
    assert result(EFBIG_TB, memory_exceeded=True).limit_hit == "memory"
    assert result(FORK_TB, output_truncated=True).limit_hit == "output"
    assert result(FORK_TB + EFBIG_TB).limit_hit == "processes"


@pytest.fixture(params=[n for n in BACKEND_NAMES if n in ("bubblewrap", "subprocess")])
async def backend(request: pytest.FixtureRequest) -> SandboxBackend:
    return await get_backend(request.param)


LIMITS = SandboxLimits(wall_time_s=20.0, memory_bytes=256 * MiB, max_processes=8)


async def test_forking_past_the_cap_reports_processes(backend: SandboxBackend) -> None:
    code = (
        "import os, time\n"
        "for _ in range(64):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(5)\n"
        "        os._exit(0)\n"
    )
    r = await run_python(backend, code, limits=LIMITS)
    assert r.exit_code == 1 and "BlockingIOError" in r.stderr, r
    assert r.limit_hit == "processes" and not r.timed_out


async def test_writing_past_max_file_bytes_reports_file_size(backend: SandboxBackend) -> None:
    limits = SandboxLimits(wall_time_s=20.0, max_file_bytes=1 * MiB)
    code = "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))\n"
    r = await run_python(backend, code, limits=limits)
    assert r.exit_code == 1 and r.limit_hit == "file_size", r


async def test_a_shell_tool_over_max_file_bytes_reports_file_size(backend: SandboxBackend) -> None:
    # Killed by SIGXFSZ on every backend: the Python launcher restores its default action.
    limits = SandboxLimits(wall_time_s=20.0, max_file_bytes=1 * MiB)
    argv = ["/bin/sh", "-c", "exec head -c 2000000 /dev/zero > big"]
    r = await backend.run(argv, limits=limits)
    assert r.killed_signal == signal.SIGXFSZ, r
    assert r.limit_hit == "file_size", r
