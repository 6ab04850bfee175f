"""A SIGKILL the run's memory cgroup did not cause is not reported as the memory limit."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from ludic.sandbox import SandboxLimits, SandboxPool, SandboxResult, find_memory_cgroups
from ludic.sandbox.cgroup import RunCgroup, with_cgroup_outcome


def killed(stderr: str = "") -> SandboxResult:
    # what classify_exit reads from any SIGKILL the runner did not send: memory
    return SandboxResult(
        stdout="",
        stderr=stderr,
        exit_code=None,
        timed_out=False,
        cpu_time_exceeded=False,
        memory_exceeded=True,
        output_truncated=False,
        killed_signal=signal.SIGKILL,
        duration_s=0.05,
        isolation="bubblewrap",
        memory_scope="cgroup1",
    )


def fake_cgroup(tmp_path: Path, version: int, *, oom_kills: int, at_cap: bool) -> RunCgroup:
    if version == 2:
        text = f"low 0\nhigh 0\nmax {int(at_cap)}\noom {oom_kills}\noom_kill {oom_kills}\n"
        (tmp_path / "memory.events").write_text(text)
    else:
        (tmp_path / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kills}\n"
        )
        (tmp_path / "memory.failcnt").write_text(f"{int(at_cap)}\n")
    return RunCgroup(path=tmp_path, version=version)


@pytest.mark.parametrize("version", [1, 2])
def test_a_sigkill_the_cgroup_saw_nothing_of_is_not_memory(tmp_path: Path, version: int) -> None:
    result = with_cgroup_outcome(
        killed(), fake_cgroup(tmp_path, version, oom_kills=0, at_cap=False)
    )
    assert result.memory_exceeded is False and result.limit_hit is None


@pytest.mark.parametrize("version", [1, 2])
def test_an_oom_kill_or_a_cap_reached_stays_memory(tmp_path: Path, version: int) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    oom = fake_cgroup(tmp_path / "a", version, oom_kills=1, at_cap=True)
    at_cap = fake_cgroup(tmp_path / "b", version, oom_kills=0, at_cap=True)
    assert with_cgroup_outcome(killed(), oom).limit_hit == "memory"
    assert with_cgroup_outcome(killed(), at_cap).limit_hit == "memory"


def test_a_reported_memory_error_stays_memory(tmp_path: Path) -> None:
    cgroup = fake_cgroup(tmp_path, 2, oom_kills=0, at_cap=False)
    assert with_cgroup_outcome(killed("MemoryError\n"), cgroup).memory_exceeded is True


def test_a_program_that_kills_itself_hit_no_limit() -> None:
    if isinstance(find_memory_cgroups(), str):
        pytest.skip("no memory cgroup on this host")
    pool = SandboxPool(limits=SandboxLimits(wall_time_s=10, memory_bytes=256 * 2**20))
    probe = asyncio.run(pool.run_python("print(1)", use_cache=False))
    if probe.memory_scope not in ("cgroup1", "cgroup2"):
        pytest.skip("this host's sandbox does not run under a memory cgroup")
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = asyncio.run(pool.run_python(code, use_cache=False))
    assert result.killed_signal == signal.SIGKILL
    assert result.limit_hit is None
