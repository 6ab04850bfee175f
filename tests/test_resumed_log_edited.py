"""A resumed log that someone edited by hand: a last record an editor saved without its final
newline is a whole record (kept, and the next record starts on its own line), not a line a
killed run cut off."""

from __future__ import annotations

import json
from pathlib import Path

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
