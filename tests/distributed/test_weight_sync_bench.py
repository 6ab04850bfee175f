"""bench/weight_sync.py's `--servers` mode pushes with the `--piece-mb` its report records
(servers, raw baseline and publisher faked: this checks the wiring, not the timings)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "weight_sync.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("weight_sync_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH.parent))  # as `python bench/weight_sync.py` runs it (_args)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


class _Process:
    def terminate(self) -> None:
        pass

    def wait(self, timeout: float) -> int:
        return 0


class _Raw:
    def __init__(self, flat: Any, receivers: int) -> None:
        pass

    def once(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_servers_mode_pushes_with_the_piece_mb_it_reports(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench()
    made: list[dict[str, Any]] = []

    class Publisher:
        def __init__(self, urls: list[str], token: str, **kwargs: Any) -> None:
            made.append(kwargs)
            self.verify = True

        def publish(self, model: Any, *, version: int) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench, "start_server", lambda name, in_place: (_Process(), "http://x"))
    monkeypatch.setattr(bench, "RawBaseline", _Raw)
    monkeypatch.setattr(bench, "BroadcastPolicyPublisher", Publisher)
    argv = ["weight_sync.py", "--models", "tiny", "--servers", "1,2", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--piece-mb", "0.5"])
    bench.main()
    report = json.loads(capsys.readouterr().out)
    assert report["piece_mb"] == 0.5 and set(report["servers"][0]["by_servers"]) == {"1", "2"}
    assert [kwargs["piece_mb"] for kwargs in made] == [0.5, 0.5]
