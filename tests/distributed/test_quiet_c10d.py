"""`quiet_c10_warnings`: a store wait failing because the store's host exited prints c10d's
C++ warning (with its stack frames) outside the scope and nothing inside it; the c10 log level
is restored after, nested scopes included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ludic.distributed.quiet_c10d import _log_level_flag, quiet_c10_warnings

pytestmark = pytest.mark.timeout(120)

WAIT_ON_A_VANISHING_STORE = textwrap.dedent(
    """
    import subprocess, sys
    from datetime import timedelta
    import torch.distributed as dist
    from ludic.distributed.quiet_c10d import quiet_c10_warnings

    HOST = (
        "import os, sys, time, torch.distributed as dist\\n"
        "s = dist.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)\\n"
        "print(s.port, flush=True); sys.stdin.readline(); os._exit(0)\\n"
    )
    host = subprocess.Popen([sys.executable, "-c", HOST], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    client = dist.TCPStore("127.0.0.1", int(host.stdout.readline()), is_master=False)
    host.stdin.write("bye\\n"); host.stdin.flush()  # the host exits while the client waits
    try:
        if sys.argv[1] == "quiet":
            with quiet_c10_warnings():
                client.wait(["never"], timedelta(seconds=30))
        else:
            client.wait(["never"], timedelta(seconds=30))
    except dist.DistNetworkError:
        print("closed", flush=True)
    """
)


def _wait_on_a_vanishing_store(how: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", WAIT_ON_A_VANISHING_STORE, how],
        capture_output=True,
        text=True,
        timeout=90,
        env={**environ, **env},
    )


def test_the_disconnect_warning_is_printed_only_outside_the_scope() -> None:
    loud, quiet = _wait_on_a_vanishing_store("loud"), _wait_on_a_vanishing_store("quiet")
    assert loud.stdout.strip() == "closed" and quiet.stdout.strip() == "closed"
    assert "[c10d]" in loud.stderr and "frame #" in loud.stderr  # a trainer exit's old noise
    assert "[c10d]" not in quiet.stderr and "frame #" not in quiet.stderr


def test_a_users_torch_cpp_log_level_wins() -> None:
    """TORCH_CPP_LOG_LEVEL set by the user: the scope changes nothing (their level holds)."""
    quiet = _wait_on_a_vanishing_store("quiet", TORCH_CPP_LOG_LEVEL="WARNING")
    assert quiet.stdout.strip() == "closed" and "[c10d]" in quiet.stderr


def test_the_log_level_is_restored_after_nested_scopes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    flag = _log_level_flag()
    if flag is None:
        pytest.skip("this libc10 does not export FLAGS_caffe2_log_level")
    before = flag.value
    with quiet_c10_warnings():
        assert flag.value >= 2
        with quiet_c10_warnings():
            assert flag.value >= 2
        assert flag.value >= 2  # the outer scope still holds
    assert flag.value == before
