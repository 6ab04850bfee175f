"""The logs a resumed run continues drop what the resume discarded, once, at the first write
with a position; records without one stay, and a record holding U+2028 (which
`str.splitlines` would split) is one record."""

from __future__ import annotations

import json
from pathlib import Path

from ludic._resumed_log import ResumedLog, batch_index_of, drop_from, step_of


def _rollout(batch: int | None, text: str = "x") -> str:
    meta = {} if batch is None else {"batch_index": batch}
    return json.dumps({"completion": text, "meta": meta}, ensure_ascii=False) + "\n"


def test_the_first_write_drops_the_replayed_batches_and_a_cut_off_line(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    kept = [_rollout(None, "old file"), _rollout(0, "a\u2028b"), _rollout(1)]
    path.write_text("".join([*kept, _rollout(2), _rollout(3)]) + '{"meta": {"batch', "utf-8")
    log = ResumedLog(path, batch_index_of)
    assert not log.before_write(None)  # a rollout of no batch (an eval) leaves the file
    assert log.before_write(2)
    assert path.read_text("utf-8") == "".join(kept)
    path.write_text(path.read_text("utf-8") + _rollout(2), "utf-8")
    assert not log.before_write(2)  # once only: the batch's other rollouts append
    assert path.read_text("utf-8") == "".join([*kept, _rollout(2)])


def test_nothing_to_drop_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert not drop_from(path, 1, step_of)  # no file yet
    path.write_text('{"step": 1}\n{"step": 2}\n')
    before = path.stat().st_mtime_ns, path.stat().st_ino
    assert not drop_from(path, 3, step_of)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before
    assert drop_from(path, 1, step_of) and path.read_text() == ""
