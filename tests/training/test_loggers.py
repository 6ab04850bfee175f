"""JSONL metrics file, console logger, fan-out and the optional-extra guards."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from ludic.training import (
    JsonlLogger,
    MultiLogger,
    RichConsoleLogger,
    TrainingLogger,
    read_metrics_jsonl,
)


def test_jsonl_logger_appends_one_record_per_step(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    log = JsonlLogger(path)
    assert isinstance(log, TrainingLogger)
    log.log({"loss": 0.5, "grad_norm": float("nan")}, step=1)
    log.log({"loss": 0.25}, step=2)
    # Readable while open (flushed per step), and valid JSON even for nan.
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["grad_norm"] == "nan"
    log.close()
    records = read_metrics_jsonl(path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 0.5), (2, 0.25)]
    assert all("time" in r for r in records)


def test_console_logger_prints_selected_keys() -> None:
    out = io.StringIO()
    log = RichConsoleLogger(keys=("loss",), every=2, console=Console(file=out, width=200))
    log.log({"loss": 1.5, "other": 3.0}, step=1)
    log.log({"loss": 0.75, "other": 3.0, "skipped_nonfinite": 1.0}, step=2)
    text = out.getvalue()
    assert "step 1" not in text and "step 2" in text and "loss=0.75" in text
    assert "other" not in text and "non-finite" in text


def test_multi_logger_fans_out(tmp_path: Path) -> None:
    a, b = JsonlLogger(tmp_path / "a.jsonl"), JsonlLogger(tmp_path / "b.jsonl")
    multi = MultiLogger([a, b])
    multi.log({"x": 1.0}, step=3)
    multi.close()
    assert (
        read_metrics_jsonl(tmp_path / "a.jsonl")[0]["x"]
        == read_metrics_jsonl(tmp_path / "b.jsonl")[0]["x"]
    )


def test_optional_loggers_explain_missing_extras() -> None:
    try:
        import wandb  # noqa: F401
    except ImportError:
        from ludic.training import WandbLogger

        with pytest.raises(ImportError, match="pip install"):
            WandbLogger(project="x")


def test_a_resumed_run_replaces_the_steps_logged_after_its_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = JsonlLogger(path)
    for step in (1, 2, 3):
        first.log({"loss": float(step)}, step=step)
    first.close()
    with path.open("a") as f:
        f.write('{"step": 4, "lo')  # a run killed mid-write
    resumed = JsonlLogger(path)  # resumed from the step-2 checkpoint
    resumed.log({"loss": 30.0}, step=3)
    resumed.log({"loss": 40.0}, step=4)
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_metrics_jsonl(path)] == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
        (4, 40.0),
    ]
    later = JsonlLogger(path)  # a run resumed at its last step appends
    later.log({"loss": 50.0}, step=5)
    later.close()
    assert [r["step"] for r in read_metrics_jsonl(path)] == [1, 2, 3, 4, 5]
