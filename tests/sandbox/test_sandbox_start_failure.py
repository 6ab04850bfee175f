"""A sandbox that never starts says why. bwrap that cannot create its namespaces (e.g. the
host's user-namespace limit reached under load) exits at once with its reason on stderr; where
runs get a memory cgroup, the error was only "could not move the sandbox's processes into
<cgroup>" (an exited process cannot be moved), which hid bwrap's reason."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic.sandbox import BubblewrapBackend, MemoryCgroups, SandboxLimits, find_memory_cgroups

REASON = "bwrap: Creating new namespace failed: No space left on device"


@pytest.fixture
def failing_bwrap() -> Iterator[str]:
    """A stand-in for bwrap that fails as it does before starting anything, where the
    unprivileged uid bwrap runs as under root can execute it (pytest's tmp_path is 0700)."""
    with tempfile.TemporaryDirectory(prefix="ludic-fake-bwrap-") as folder:
        Path(folder).chmod(0o755)
        script = Path(folder) / "bwrap"
        script.write_text(f"#!/bin/sh\necho '{REASON}' >&2\nexit 1\n")
        script.chmod(0o755)
        yield str(script)


async def test_a_sandbox_that_never_started_names_bwraps_reason(failing_bwrap: str) -> None:
    cgroups = find_memory_cgroups()
    if not isinstance(cgroups, MemoryCgroups):
        pytest.skip(f"needs a memory cgroup (the gate the sandbox waits at): {cgroups}")
    backend = BubblewrapBackend(bwrap=failing_bwrap, memory_cgroups=cgroups)
    with pytest.raises(RuntimeError, match=r"did not start.*ended \(status 1\b.*namespace failed"):
        await backend.run(["python3", "-c", "print(1)"], limits=SandboxLimits())
