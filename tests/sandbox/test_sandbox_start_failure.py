"""A sandbox that never starts says why, and is never scored as the program's failure.

bwrap that cannot create its namespaces (e.g. the host's user-namespace limit reached under
load) exits 1 at once with its reason on stderr. Where runs get a memory cgroup, the error was
only "could not move the sandbox's processes into <cgroup>" (an exited process cannot be
moved), which hid bwrap's reason. Where they get none, it came back as the program's exit 1,
read as limit_hit="file_size" ("No space left on device") and cached: a host failure scored as
the model's wrong code for every identical run of a group. bwrap's --json-status-fd tells the
two apart: it reports an exit code only for a program it started.

The stand-ins for bwrap below are Python scripts that act out each case; they must be
executable by the unprivileged uid bwrap runs as under root (pytest's tmp_path is 0700)."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ludic.sandbox import (
    BubblewrapBackend,
    MemoryCgroups,
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxPool,
    SandboxStartError,
    default_python,
    find_memory_cgroups,
)

REASON = "bwrap: Creating new namespace failed: No space left on device"
PROGRAM = ["python3", "-c", "print(1)"]

_STAND_IN = """#!{python}
import os, sys
args = sys.argv[1:]
status = int(args[args.index("--json-status-fd") + 1])
os.write(status, {reports!r})
sys.stdout.write({stdout!r})
sys.stderr.write({stderr!r})
sys.exit({status!r})
"""


def _reports(started: bool, exit_code: int | None) -> bytes:
    """What bwrap writes to its --json-status-fd: the child's pid once it cloned the
    namespaces, the exit code once the program it started exits."""
    lines = ['{ "child-pid": 2 }'] if started else []
    lines += [f'{{ "exit-code": {exit_code} }}'] if exit_code is not None else []
    return "".join(line + "\n" for line in lines).encode()


@pytest.fixture
def stand_in() -> Iterator[Callable[..., str]]:
    """Makes a stand-in bwrap: `started` reports the child's pid, `exit_code` the program's
    exit (as bwrap does only for a program it ran); then it writes `stdout` / `stderr` and
    exits with `status`."""
    with tempfile.TemporaryDirectory(prefix="ludic-fake-bwrap-") as folder:
        Path(folder).chmod(0o755)
        made = iter(range(1000))

        def make(
            *,
            started: bool,
            exit_code: int | None,
            stdout: str = "",
            stderr: str = "",
            status: int = 1,
        ) -> str:
            script = Path(folder) / f"bwrap{next(made)}"
            script.write_text(
                _STAND_IN.format(
                    python=default_python(),
                    reports=_reports(started, exit_code),
                    stdout=stdout,
                    stderr=stderr,
                    status=status,
                )
            )
            script.chmod(0o755)
            return str(script)

        yield make


@pytest.fixture
def failing_bwrap(stand_in: Callable[..., str]) -> str:
    """bwrap whose clone() of the namespaces failed: no child, its reason on stderr, exit 1."""
    return stand_in(started=False, exit_code=None, stderr=REASON + "\n")


async def test_a_sandbox_that_never_started_names_bwraps_reason(failing_bwrap: str) -> None:
    cgroups = find_memory_cgroups()
    if not isinstance(cgroups, MemoryCgroups):
        pytest.skip(f"needs a memory cgroup (the gate the sandbox waits at): {cgroups}")
    backend = BubblewrapBackend(bwrap=failing_bwrap, memory_cgroups=cgroups)
    # Gone before it could be moved into its cgroup, or exited once moved: the same error.
    with pytest.raises(SandboxStartError, match=r"did not start.*status 1\b.*namespace failed"):
        await backend.run(PROGRAM, limits=SandboxLimits())


async def test_without_a_memory_cgroup_bwraps_failure_is_no_exit_of_the_program(
    failing_bwrap: str,
) -> None:
    backend = BubblewrapBackend(bwrap=failing_bwrap, memory_cgroups=None)
    with pytest.raises(SandboxStartError, match=r"did not start.*status 1 .*namespace failed"):
        await backend.run(PROGRAM, limits=SandboxLimits())
    problem = await backend.probe()
    assert problem is not None and "cannot start a sandbox here" in problem and REASON in problem


async def test_a_setup_that_failed_after_the_namespaces_is_a_start_failure(
    stand_in: Callable[..., str],
) -> None:
    said = "bwrap: Can't mount tmpfs on /newroot/work: No space left on device"
    backend = BubblewrapBackend(
        bwrap=stand_in(started=True, exit_code=None, stderr=said), memory_cgroups=None
    )
    with pytest.raises(SandboxStartError, match="Can't mount tmpfs"):
        await backend.run(PROGRAM, limits=SandboxLimits())


async def test_a_program_that_found_its_disk_full_is_still_the_programs_failure(
    stand_in: Callable[..., str],
) -> None:
    said = "OSError: [Errno 28] No space left on device\n"
    bwrap = stand_in(started=True, exit_code=1, stderr=said, status=1)
    result = await BubblewrapBackend(bwrap=bwrap, memory_cgroups=None).run(
        PROGRAM, limits=SandboxLimits()
    )
    assert result.exit_code == 1 and result.limit_hit == "file_size" and result.stderr == said


async def test_a_start_failure_is_never_cached(
    stand_in: Callable[..., str], failing_bwrap: str
) -> None:
    working = stand_in(started=True, exit_code=0, stdout="ok\n", status=0)
    backend = BubblewrapBackend(bwrap=working, memory_cgroups=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SandboxIsolationWarning)  # one process per run
        pool = SandboxPool(backend)
    await pool.backend()  # probed with the working stand-in
    backend.bwrap = failing_bwrap
    for _ in range(2):  # each identical run tries again, and fails again
        with pytest.raises(SandboxStartError, match="namespace failed"):
            await pool.run_python("print(1)")
    backend.bwrap = working
    first = await pool.run_python("print(1)")
    assert first.stdout == "ok\n" and not first.cached
    assert (await pool.run_python("print(1)")).cached
