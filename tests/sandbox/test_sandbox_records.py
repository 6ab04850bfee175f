"""SandboxLimits validation, SandboxResult views, and exit classification by hand."""

from __future__ import annotations

import json
import signal

import pytest

from ludic.sandbox import SandboxLimits, SandboxResult, classify_exit

LIMITS = SandboxLimits(cpu_time_s=2)


@pytest.mark.parametrize(
    "field,value",
    [("wall_time_s", 0), ("cpu_time_s", 1.5), ("memory_bytes", -1), ("max_processes", True)],
)
def test_limits_reject_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SandboxLimits(**{field: value})  # type: ignore[arg-type]


def classify(
    code: int,
    stderr: str = "",
    *,
    killed: bool = False,
    wrapped: bool = False,
    duration: float = 0.1,
) -> dict[str, object]:
    return classify_exit(
        code,
        stderr,
        limits=LIMITS,
        duration_s=duration,
        killed_by_runner=killed,
        signal_as_128_plus=wrapped,
    )


def test_plain_exit_codes() -> None:
    assert classify(0) == {
        "exit_code": 0,
        "killed_signal": None,
        "cpu_time_exceeded": False,
        "memory_exceeded": False,
    }
    assert classify(137)["exit_code"] == 137  # a subprocess's 137 is an exit code
    assert classify(137, wrapped=True)["killed_signal"] == signal.SIGKILL  # bwrap's: a signal


def test_signals_and_limits() -> None:
    assert classify(-signal.SIGXCPU)["cpu_time_exceeded"] is True
    # SIGKILL after the CPU budget, not sent by the runner: the hard RLIMIT_CPU.
    assert classify(-9, duration=2.5)["cpu_time_exceeded"] is True
    # SIGKILL sent by the runner (wall time, output cap): neither CPU nor memory.
    killed = classify(-9, killed=True, duration=2.5)
    assert killed["cpu_time_exceeded"] is False and killed["memory_exceeded"] is False
    # SIGKILL nobody asked for, early: an OOM kill (cgroup memory limit).
    assert classify(128 + 9, wrapped=True)["memory_exceeded"] is True
    tb = "Traceback (most recent call last):\n  ...\nMemoryError\n"
    assert classify(1, tb) == {
        "exit_code": 1,
        "killed_signal": None,
        "cpu_time_exceeded": False,
        "memory_exceeded": True,
    }
    assert classify(1, "print('MemoryError')")["memory_exceeded"] is False


def test_result_views_and_json() -> None:
    ok = SandboxResult(stdout="1\n", stderr="", exit_code=0, isolation="bubblewrap")
    assert ok.ok and ok.limit_hit is None
    slow = SandboxResult(stdout="", stderr="", exit_code=None, timed_out=True, killed_signal=9)
    assert not slow.ok and slow.limit_hit == "wall_time"
    both = SandboxResult(
        stdout="", stderr="", exit_code=1, memory_exceeded=True, output_truncated=True
    )
    assert both.limit_hit == "memory"
    assert SandboxResult(**json.loads(json.dumps(both.to_dict()))) == both
