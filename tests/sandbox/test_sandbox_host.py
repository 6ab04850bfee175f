"""Host plumbing: uid claims, scratch directories, and the bubblewrap command line exposing
nothing of the host but what it must."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from ludic.sandbox import BubblewrapBackend, ContainerBackend, SandboxLimits
from ludic.sandbox.host import claim_uid, kill_uid_processes, scratch_dir

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid claims are for root trainers")


@needs_root
def test_concurrent_claims_get_distinct_unused_uids() -> None:
    import pwd

    with contextlib.ExitStack() as stack:
        uids = [stack.enter_context(claim_uid()) for _ in range(3)]
    assert len(set(uids)) == 3 and 0 not in uids
    for uid in uids:
        with pytest.raises(KeyError):
            pwd.getpwuid(uid)  # no real account behind it


@needs_root
def test_a_uid_with_unreaped_processes_is_not_claimed() -> None:
    """Killed sandbox processes wait as zombies until pid 1 reaps them, still counting against
    their uid's RLIMIT_NPROC: a claim must pass over that uid."""
    with claim_uid() as base:
        pass  # the first uid free right now
    child = os.fork()
    if child == 0:  # a process of `base` that exits and stays unreaped
        os.setuid(base)
        os._exit(0)
    try:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
        # Other uids above `base` may hold zombies of earlier sandbox runs for a moment (pid 1
        # reaps them when it gets to it): any uid but `base` will do.
        with claim_uid(base=base, count=64) as uid:
            assert uid > base
    finally:
        os.waitpid(child, 0)
    with claim_uid(base=base, count=1) as uid:
        assert uid == base


def test_kill_uid_processes_refuses_our_own_uid() -> None:
    with pytest.raises(ValueError, match="refusing"):
        kill_uid_processes(os.geteuid())


def test_scratch_holds_the_files_and_is_removed() -> None:
    with scratch_dir({"main.py": b"print(1)", "data/in.txt": b"x"}, owner=None) as path:
        assert (path / "main.py").read_bytes() == b"print(1)"
        assert (path / "data" / "in.txt").read_bytes() == b"x"
        assert path.stat().st_mode & 0o777 == 0o700
    assert not path.exists()


def test_scratch_refuses_names_that_escape() -> None:
    with (
        pytest.raises(ValueError, match="relative path"),
        scratch_dir({"../evil": b""}, owner=None),
    ):
        pass


def test_bubblewrap_command_exposes_only_what_it_must() -> None:
    backend = BubblewrapBackend(bwrap="bwrap", python="/usr/bin/python3")
    limits = SandboxLimits(max_file_bytes=3 * 2**20, scratch_bytes=5 * 2**20)
    files = [(7, "/work/main.py"), (8, "/work/data/in.txt")]
    argv = backend.command(["/usr/bin/python3", "main.py"], limits, files=files, gate_fd=9)
    assert argv[-2:] == ["/usr/bin/python3", "main.py"]
    for flag in ("--unshare-all", "--die-with-parent", "--clearenv", "--new-session"):
        assert flag in argv
    assert "--share-net" not in argv
    sources = [
        argv[i + 1] for i, a in enumerate(argv) if a.endswith("bind") or a.endswith("bind-try")
    ]
    assert "--bind" not in argv  # nothing of the host is writable
    for source in sources:
        assert source.startswith(("/usr", "/etc/", "/lib", "/bin", "/sbin"))
    # The only writable places: tmpfs mounts of explicit sizes; / and /dev read-only.
    tmpfs = {argv[i + 1]: argv[i - 3] for i, a in enumerate(argv) if a == "--tmpfs"}
    assert argv[argv.index("--tmpfs") - 4] == "--size"
    assert tmpfs == {"/dev/shm": str(3 * 2**20), "/tmp": str(3 * 2**20), "/work": str(5 * 2**20)}
    remounted = [argv[i + 1] for i, a in enumerate(argv) if a == "--remount-ro"]
    assert remounted == ["/dev", "/"]
    copied = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--file"]
    assert copied == [("7", "/work/main.py"), ("8", "/work/data/in.txt")]
    assert argv[argv.index("--dir") + 1] == "/work/data"
    assert argv[argv.index("--block-fd") + 1] == "9"


def test_bubblewrap_without_a_memory_cgroup_allows_one_process() -> None:
    backend = BubblewrapBackend(python="/usr/bin/python3", memory_cgroups=None)
    assert backend.memory_scope == "process" and backend.memory_problem
    argv = backend.command(["python3"], SandboxLimits(max_processes=32))
    assert "--nproc=1" in argv or '"nproc": 1' in " ".join(argv)  # prlimit or the launcher
    assert "--block-fd" not in argv


def test_container_command_cuts_network_privileges_and_resources(tmp_path: Path) -> None:
    limits = SandboxLimits(memory_bytes=64 * 2**20, max_processes=8, cpu_time_s=3)
    backend = ContainerBackend(cli="podman", image="img:1")
    argv = backend.command(["python3", "main.py"], tmp_path, limits, "ludic-sbx-x")
    assert argv[:2] == ["podman", "run"] and argv[-3:] == ["img:1", "python3", "main.py"]
    assert backend.isolation == "podman"

    def value(flag: str) -> list[str]:
        return [argv[i + 1] for i, a in enumerate(argv) if a == flag]

    assert value("--network") == ["none"] and value("--cap-drop") == ["ALL"]
    assert value("--memory") == value("--memory-swap") == [str(64 * 2**20)]
    assert value("--pids-limit") == ["8"] and "cpu=3:4" in value("--ulimit")
    assert value("--volume") == [f"{tmp_path}:/work:rw"] and "--read-only" in argv
    assert (
        value("--shm-size") == [str(limits.max_file_bytes)] and backend.memory_scope == "container"
    )
    assert value("--user") == ["65534:65534"] and "no-new-privileges" in value("--security-opt")
