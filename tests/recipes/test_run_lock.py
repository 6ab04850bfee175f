"""`run_lock` across two processes: a live holder's lock refuses a second run, naming its pid
and command; a holder killed with SIGKILL leaves a file the next run takes over (saying whose
it was); the file goes when the run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.recipes.run_lock import RunDirInUseError, check_run_lock, run_lock

pytestmark = pytest.mark.skipif(os.name != "posix", reason="flock is POSIX")
HOLD = """
import sys, time
from pathlib import Path
from ludic.recipes.run_lock import run_lock
with run_lock(Path(sys.argv[1]), what="test"):
    print("held", flush=True)
    time.sleep(600)
"""


def hold(path: Path) -> subprocess.Popen[str]:
    """A process holding `path`'s lock (it says "held" once it does)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path), "--marker"], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_live_run_is_named_and_a_killed_one_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "run" / "x.lock"
    holder = hold(path)
    try:
        for attempt in (
            lambda: check_run_lock(path, what="`ludic train`"),
            lambda: run_lock(path, what="`ludic train`").__enter__(),
        ):
            with pytest.raises(RunDirInUseError) as refused:
                attempt()
            text = str(refused.value)
            assert f"{path.parent} is in use by another `ludic train` run (pid {holder.pid}" in text
            assert "-c " in text and "--marker" in text  # its command line
            assert "pass another --out-dir" in text
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup: the file stays, the lock goes
        holder.wait()
    assert path.exists()
    check_run_lock(path, what="`ludic train`")  # a dead holder blocks nothing
    notices: list[str] = []
    with run_lock(path, what="`ludic train`", notice=notices.append):
        [notice] = notices
        assert f"took over {path} from a run that no longer holds it (pid {holder.pid}" in notice
        assert f'"pid": {os.getpid()}' in path.read_text()
    assert not path.exists()


def test_a_lock_released_is_free_again_and_check_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    check_run_lock(path, what="test")
    assert not path.exists()
    notices: list[str] = []
    for _ in range(2):
        with run_lock(path, what="test", notice=notices.append):
            assert path.exists()
        assert not path.exists()
    assert notices == []  # a cleanly ended run leaves nothing to take over


def test_a_refused_run_leaves_the_holder_alone(tmp_path: Path) -> None:
    """Refused without waiting (a blocking lock would wait out the holder's 600 s sleep) and
    without touching the holder's record or its removal of the file at its end."""
    path = tmp_path / "x.lock"
    holder = hold(path)
    try:
        with pytest.raises(RunDirInUseError), run_lock(path, what="test"):
            raise AssertionError("the block ran under another run's lock")
        assert holder.poll() is None
        assert f'"pid": {holder.pid}' in path.read_text()  # the holder's record untouched
    finally:
        holder.kill()
        holder.wait()


def test_another_commands_lock_check_never_refuses_a_starting_run(tmp_path: Path) -> None:
    """`check_run_lock` (a second command's cheap check before its model loads) probed with an
    exclusive lock, so a run starting at that moment was refused, naming a dead run: ~1 in 5
    takeovers of a killed run's file (found in review)."""
    import contextlib
    import json
    import socket
    import threading

    path = tmp_path / "run.lock"
    dead = {"pid": 2**22 + 12345, "host": socket.gethostname(), "started": "x", "command": "old"}
    path.write_text(json.dumps(dead))  # a kill -9'd run's file
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            with contextlib.suppress(RunDirInUseError):  # refused while the run holds it: right
                check_run_lock(path, what="`ludic train`")

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    refused = 0
    try:
        for _ in range(500):
            try:
                with run_lock(path, what="`ludic train`"):
                    pass
            except RunDirInUseError:
                refused += 1
            path.write_text(json.dumps(dead))
    finally:
        stop.set()
        prober.join()
    assert refused == 0
