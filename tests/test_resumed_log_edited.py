"""A resumed log that someone edited by hand: a last record an editor saved without its final
newline is a whole record (kept, and the next record starts on its own line), not a line a
killed run cut off. A line that is not UTF-8 is a damaged line like any other that is not JSON
(dropped, with a warning naming it), not a UnicodeDecodeError raised from the resumed run's first
logged step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ludic._resumed_log import drop_from, step_of
from ludic.training.loggers import JsonlLogger, read_metrics_jsonl


def _row(step: int) -> str:
    return json.dumps({"step": step, "batch/mean_reward": -1.0})


def test_a_last_record_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f"{_row(1)}\n{_row(2)}\n{_row(3)}", "utf-8")  # as an editor saves it
    logger = JsonlLogger(path)
    logger.log({"batch/mean_reward": 0.5}, 4)  # resumed at step 3
    logger.close()
    assert [r["step"] for r in read_metrics_jsonl(path)] == [1, 2, 3, 4]


def test_a_last_record_without_its_newline_gets_one_even_when_nothing_is_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(f"{_row(1)}\n{_row(2)}", "utf-8")
    assert drop_from(path, 3, step_of)  # rewritten: the next append starts a line
    assert path.read_text("utf-8") == f"{_row(1)}\n{_row(2)}\n"


def test_a_line_that_is_not_utf8_is_dropped_as_damaged_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "metrics.jsonl"
    edited = _row(2)[:-1].encode() + ', "note": "caf\xe9"}'.encode("latin-1")
    path.write_bytes(f"{_row(1)}\n".encode() + edited + f"\n{_row(3)}\n{_row(4)}\n".encode())
    logger = JsonlLogger(path)
    with caplog.at_level(logging.WARNING):
        logger.log({"batch/mean_reward": 0.5}, 4)
    logger.close()
    assert [r["step"] for r in read_metrics_jsonl(path)] == [1, 3, 4]
    assert "metrics.jsonl" in caplog.text and "line 2" in caplog.text
