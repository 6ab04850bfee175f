"""Limits hold for the whole run, not each process: memory across forks, filling `/`, `/dev`,
`/dev/shm`, `/tmp` and the scratch directory, and the one-process fallback where no memory
cgroup can be made. Cgroup attacks run where `find_memory_cgroups` finds a place (they skip
naming why elsewhere); the fallback runs everywhere, forced with `memory_cgroups=None`."""

from __future__ import annotations

import re

import pytest
from sandbox_backends import MiB, get_backend, run_python

from ludic.sandbox import (
    BubblewrapBackend,
    MemoryCgroups,
    RestrictedSubprocessBackend,
    SandboxBackend,
    SandboxLimits,
    find_memory_cgroups,
)

pytestmark = pytest.mark.slow

LIMITS = SandboxLimits(
    wall_time_s=30.0,
    cpu_time_s=20,
    memory_bytes=160 * MiB,
    max_processes=16,
    max_file_bytes=4 * MiB,
    scratch_bytes=16 * MiB,
    max_output_bytes=64 * 1024,
)


def cgroups_or_skip() -> MemoryCgroups:
    found = find_memory_cgroups()
    if isinstance(found, str):
        pytest.skip(f"no memory cgroup can be made on this host: {found}")
    return found


async def backend_named(name: str) -> SandboxBackend:
    """ "bubblewrap" / "subprocess" with a memory cgroup; "<name>/process" without one."""
    kind, _, scope = name.partition("/")
    probed = await get_backend(kind)  # skips where the backend cannot run here
    if scope == "process":
        backend: SandboxBackend
        if kind == "bubblewrap":
            backend = BubblewrapBackend(python=probed.python, memory_cgroups=None)
        else:
            assert isinstance(probed, RestrictedSubprocessBackend)
            backend = RestrictedSubprocessBackend(
                python=probed.python, isolate_network=probed.isolate_network, memory_cgroups=None
            )
        return backend
    cgroups_or_skip()
    assert getattr(probed, "memory_cgroups", None) is not None
    return probed


# Six children each fill 48 MiB and hold it: 288 MiB in all under a 160 MiB cap.
FORK_ATTACK = """
import os, select, time
r, w = os.pipe()
kids = []
for i in range(6):
    try:
        pid = os.fork()
    except OSError as e:
        print("fork refused", e.errno, flush=True)
        break
    if pid == 0:
        os.close(r)
        block = b"\\x01" * (48 << 20)
        os.write(w, bytes([i]))
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
os.close(w)
filled, deadline = set(), time.time() + 6
while time.time() < deadline:
    if select.select([r], [], [], 0.2)[0]:
        data = os.read(r, 64)
        filled |= set(data)
        if not data or len(filled) == len(kids):
            break
time.sleep(1)  # let the kernel act on the last allocations
alive = {i for i, pid in enumerate(kids) if os.waitpid(pid, os.WNOHANG) == (0, 0)}
print("forked", len(kids), "holding", len(filled & alive), flush=True)
for pid in kids:
    try:
        os.kill(pid, 9)
    except OSError:
        pass
"""


@pytest.mark.parametrize("name", ["bubblewrap", "subprocess"])
async def test_memory_across_forks_is_capped_for_the_whole_run(name: str) -> None:
    backend = await backend_named(name)
    result = await run_python(backend, FORK_ATTACK, limits=LIMITS)
    assert result.memory_scope in ("cgroup1", "cgroup2")
    assert result.memory_exceeded and result.limit_hit == "memory", result
    held = re.search(r"forked (\d) holding (\d)", result.stdout)
    if held is not None:  # (the kernel may have killed the parent instead)
        forked, holding = int(held.group(1)), int(held.group(2))
        assert forked == 6 and holding * 48 * MiB < LIMITS.memory_bytes, result.stdout


@pytest.mark.parametrize("name", ["bubblewrap/process", "subprocess/process"])
async def test_without_a_cgroup_a_run_is_one_process(name: str) -> None:
    """The fallback: RLIMIT_NPROC 1, so the per-process RLIMIT_AS caps the whole run."""
    backend = await backend_named(name)
    result = await run_python(backend, FORK_ATTACK, limits=LIMITS)
    assert result.memory_scope == "process" and result.exit_code == 0, result
    assert "fork refused 11" in result.stdout and "forked 0 holding 0" in result.stdout
    threads = "import threading\ntry:\n    threading.Thread(target=print).start()\nexcept RuntimeError as e:\n    print('thread refused')\n"
    assert (await run_python(backend, threads, limits=LIMITS)).stdout == "thread refused\n"
    bomb = "blocks = []\nwhile True:\n    blocks.append(b'x' * (8 << 20))\n"
    result = await run_python(backend, bomb, limits=LIMITS)
    assert result.memory_exceeded and result.limit_hit == "memory"


# Writes 1 MiB at a time to new files under each directory until the first error; prints how
# many MiB each place took and why it stopped.
FILL = """
import os, sys
for place in sys.argv[1:]:
    written, why = 0, "no error"
    try:
        for n in range(1000):
            with open(os.path.join(place, f"fill{n}"), "wb") as file:
                for _ in range(3):
                    file.write(b"x" * (1 << 20))
                    file.flush()
                    written += 1
    except OSError as e:
        why = os.strerror(e.errno)
    print(place, written, why, flush=True)
"""


async def fill(backend: SandboxBackend, *places: str, limits: SandboxLimits = LIMITS) -> dict:
    argv = [backend.python, "main.py", *places]
    result = await backend.run(argv, files={"main.py": FILL.encode()}, limits=limits)
    written = {}
    for line in result.stdout.splitlines():
        place, mib, why = line.split(" ", 2)
        written[place] = (int(mib), why)
    return {"result": result, **written}


async def test_filling_root_and_dev_is_refused() -> None:
    backend = await get_backend("bubblewrap")
    out = await fill(backend, "/", "/dev", "/usr", "/etc")
    for place in ("/", "/dev"):
        assert out[place] == (0, "Read-only file system"), out
    assert out["/usr"][0] == 0 and out["/etc"][0] == 0


@pytest.mark.parametrize("place", ["/dev/shm", "/tmp"])
async def test_filling_dev_shm_or_tmp_stops_at_its_size(place: str) -> None:
    backend = await get_backend("bubblewrap")
    out = await fill(backend, place)
    mib, why = out[place]
    assert why == "No space left on device" and mib * MiB <= LIMITS.max_file_bytes, out


async def test_filling_scratch_stops_at_scratch_bytes() -> None:
    """Many files, each under the per-file cap (the attack that passed before: 48 x 7 MiB
    under an 8 MiB cap), stop at the scratch directory's size."""
    backend = await get_backend("bubblewrap")
    limits = SandboxLimits(
        wall_time_s=30.0, memory_bytes=256 * MiB, max_file_bytes=8 * MiB, scratch_bytes=16 * MiB
    )
    out = await fill(backend, ".", limits=limits)
    mib, why = out["."]
    assert why == "No space left on device" and mib * MiB <= limits.scratch_bytes, out


async def test_tmpfs_writes_count_against_the_memory_cap() -> None:
    """With a memory cgroup, what a run stores in its tmpfs mounts is memory of the run: a
    scratch directory larger than the cap fills only up to the cap."""
    cgroups_or_skip()
    backend = await get_backend("bubblewrap")
    limits = SandboxLimits(
        wall_time_s=30.0, memory_bytes=64 * MiB, max_file_bytes=16 * MiB, scratch_bytes=512 * MiB
    )
    out = await fill(backend, ".", limits=limits)
    result = out["result"]
    assert result.memory_exceeded, result
    if "." in out:  # the writer may have been killed before it could report
        assert out["."][0] * MiB < limits.memory_bytes


async def test_files_larger_than_scratch_are_refused_before_running() -> None:
    backend = await get_backend("bubblewrap")
    limits = SandboxLimits(scratch_bytes=1 * MiB)
    with pytest.raises(ValueError, match="scratch_bytes"):
        await backend.run(["true"], files={"big": b"x" * (2 * MiB)}, limits=limits)
