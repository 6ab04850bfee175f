"""rl_step.py and weight_sync.py record the CPU model in their JSON (`measured_on`, as the
other benches do through bench/_machine.py): both recorded `machine` from `platform`, which on
Linux says only x86_64, so a row's machine could not be told from another's. rl_step.py runs
in process with stand-ins for its arms (the TRL side needs its own virtualenv, absent here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


class _Arm:
    """A bench arm that steps at once: what rl_step.py times is beside the point here."""

    parameters = 1

    def __init__(self, *_: object, **__: object) -> None:
        self.info: dict[str, Any] = {}

    def step(self) -> dict[str, float]:
        return {"step_s": 1.0, "cpu_s": 1.0, "busiest_process_cpu_s": 1.0}

    def close(self) -> None:
        pass


def _expected_cpu() -> str:
    from _machine import cpu_model

    return cpu_model()


def test_rl_step_records_the_cpu_model(
    bench_path: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import rl_step

    monkeypatch.setattr(rl_step, "TrlProcess", _Arm)
    monkeypatch.setattr(rl_step, "LudicSide", _Arm)
    monkeypatch.setattr(rl_step, "check_trl_python", lambda python: None)
    monkeypatch.setattr(rl_step, "save_model_dir", lambda name, root: root)
    argv = ["rl_step.py", "--rounds", "1", "--warmup", "0", "--ludic", "sync"]
    monkeypatch.setattr(sys, "argv", [*argv, "--trl-threads", "1"])
    rl_step.main()
    report = json.loads(capsys.readouterr().out)
    assert report["measured_on"]["cpu"] == _expected_cpu(), report
    assert len(report["measured_on"]["loadavg_before_after"]) == 2


@pytest.mark.slow
def test_weight_sync_records_the_cpu_model(bench_path: None) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "weight_sync.py"), "--models", "tiny", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout)["measured_on"]
    assert measured["cpu"] == _expected_cpu(), measured
