"""Memory cgroups: finding a place to make them (or saying why not and what to do), one per
run with the cap written, processes moved in and killed, nothing left behind. And the pool's
loud warning when a host cannot give the strongest isolation."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ludic.sandbox import (
    BubblewrapBackend,
    MemoryCgroups,
    RestrictedSubprocessBackend,
    SandboxIsolationWarning,
    SandboxLimits,
    SandboxPool,
    find_memory_cgroups,
    isolation_gaps,
)
from ludic.sandbox.cgroup import ENV_VAR, remove_stale

MiB = 1024 * 1024


def cgroups_or_skip() -> MemoryCgroups:
    found = find_memory_cgroups()
    if isinstance(found, str):
        pytest.skip(f"no memory cgroup can be made on this host: {found}")
    return found


def our_run_cgroups(cgroups: MemoryCgroups) -> list[Path]:
    return list(cgroups.parent.glob(f"ludic-sbx-{os.getpid()}-*"))


def test_a_bad_explicit_cgroup_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "/nonexistent/cgroup")
    found = find_memory_cgroups(use_cached=False)
    assert isinstance(found, str)
    assert f"{ENV_VAR}=/nonexistent/cgroup cannot be used" in found
    assert "not a cgroup directory" in found


def test_run_cgroup_caps_moves_kills_and_is_removed() -> None:
    cgroups = cgroups_or_skip()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with cgroups.run_cgroup(96 * MiB) as cgroup:
            limit = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
            assert int((cgroup.path / limit).read_text()) == 96 * MiB
            cgroup.join_tree(sleeper.pid)
            assert cgroup.pids() == [sleeper.pid]
            assert cgroup.oom_kills() == 0
        assert sleeper.wait(timeout=10) == -9  # killed with the cgroup
    finally:
        sleeper.kill()
    assert not cgroup.path.exists()


async def test_runs_leave_no_cgroup_behind() -> None:
    cgroups = cgroups_or_skip()
    backend = BubblewrapBackend()
    if await backend.probe() is not None:
        pytest.skip("bubblewrap cannot run here")
    result = await backend.run([backend.python, "-c", "print(1)"], limits=SandboxLimits())
    assert result.stdout == "1\n" and result.memory_scope == cgroups.scope
    assert our_run_cgroups(cgroups) == []


def test_stale_cgroups_of_dead_trainers_are_removed() -> None:
    cgroups = cgroups_or_skip()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = cgroups.parent / f"ludic-sbx-{dead.pid}-0"
    stale.mkdir()
    mine = cgroups.parent / f"ludic-sbx-{os.getpid()}-999999"
    mine.mkdir()
    try:
        remove_stale(cgroups.parent)
        assert not stale.exists() and mine.exists()  # a live trainer's cgroup stays
    finally:
        for path in (stale, mine):
            if path.exists():
                path.rmdir()


# ---- the pool says loudly what it cannot give ---------------------------------------------


def test_pool_is_quiet_where_everything_works() -> None:
    cgroups_or_skip()
    if not os.access("/usr/bin/bwrap", os.X_OK):
        pytest.skip("bubblewrap is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxIsolationWarning)
        SandboxPool()
    assert isolation_gaps() == []


def test_pool_warns_without_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ludic.sandbox.pool.shutil.which", lambda name: None)
    with pytest.warns(SandboxIsolationWarning, match="apt-get install bubblewrap"):
        SandboxPool()


def test_pool_warns_without_a_memory_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "ludic.sandbox.pool.find_memory_cgroups", lambda: "cgroupfs is read-only (test)"
    )
    with pytest.warns(SandboxIsolationWarning, match="ONE process.*read-only \\(test\\)"):
        SandboxPool()


def test_pool_warns_about_a_weak_backend_it_is_given() -> None:
    backend = RestrictedSubprocessBackend(memory_cgroups=None)
    with pytest.warns(SandboxIsolationWarning) as record:
        SandboxPool(backend)
    messages = " | ".join(str(w.message) for w in record)
    assert "weaker than bubblewrap" in messages and "hide world-readable host files" in messages
    assert "memory_cgroups=None" in messages or "ONE process" in messages
