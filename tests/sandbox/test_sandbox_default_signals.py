"""A sandboxed program starts with SIGXFSZ and SIGPIPE at their default action on every
backend: the Python launcher (the subprocess backend's, and bubblewrap's where there is no
`prlimit`) ignores both as every Python does, and an ignored signal survives execve, so a shell
tool over `max_file_bytes` got EFBIG (a different record, or none when it hid the error) where
`prlimit` under bubblewrap, or a shell, lets SIGXFSZ kill it; and `yes | head` printed "Broken
pipe"."""

from __future__ import annotations

import signal

import pytest
from sandbox_backends import MiB, get_backend

from ludic.sandbox import BubblewrapBackend, SandboxBackend, SandboxLimits

LIMITS = SandboxLimits(wall_time_s=20.0, max_file_bytes=1 * MiB)


@pytest.fixture(params=["bubblewrap", "bubblewrap/launcher", "subprocess"])
async def backend(request: pytest.FixtureRequest) -> SandboxBackend:
    """Each backend that runs here (skipped, saying why, where not); "bubblewrap/launcher" is
    bubblewrap setting its rlimits with the Python launcher, as where `prlimit` is missing."""
    kind, _, via = request.param.partition("/")
    probed = await get_backend(kind)
    if via == "launcher":
        assert isinstance(probed, BubblewrapBackend)
        launcher = BubblewrapBackend(python=probed.python, memory_cgroups=probed.memory_cgroups)
        launcher.prlimit = None
        return launcher
    return probed


@pytest.mark.parametrize("hide_error", ["", " 2>/dev/null"])
async def test_a_shell_tool_over_the_file_cap_is_killed_by_sigxfsz(
    backend: SandboxBackend, hide_error: str
) -> None:
    """The same record on every backend: killed by SIGXFSZ, limit "file_size", even when the
    program would have hidden the EFBIG (it was then recorded as no limit at all)."""
    argv = ["/bin/sh", "-c", f"exec head -c 2000000 /dev/zero > big{hide_error}"]
    r = await backend.run(argv, limits=LIMITS)
    assert (r.exit_code, r.killed_signal, r.limit_hit, r.stderr) == (
        None,
        signal.SIGXFSZ,
        "file_size",
        "",
    ), r


async def test_the_program_ignores_neither_sigpipe_nor_sigxfsz(backend: SandboxBackend) -> None:
    r = await backend.run(["/bin/sh", "-c", "exec grep SigIgn /proc/self/status"], limits=LIMITS)
    assert r.exit_code == 0, r
    ignored = int(r.stdout.split()[1], 16)  # bit n-1 set: signal n ignored
    assert not ignored & (1 << (signal.SIGPIPE - 1)), r.stdout
    assert not ignored & (1 << (signal.SIGXFSZ - 1)), r.stdout


async def test_a_closed_pipe_ends_the_writer_quietly(backend: SandboxBackend) -> None:
    r = await backend.run(["/bin/sh", "-c", "yes | head -n 1"], limits=LIMITS)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "y\n", ""), r
