"""Loading QA datasets from local JSONL files, and the small math sample bundled with Ludic.

It deliberately downloads nothing: point `load_jsonl_dataset` at your own GSM8K-style file
(`{"question": ..., "answer": "... #### 42"}` per line); `DatasetQAEnv`'s default target parser
reads the "####" convention.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

MATH_SAMPLE = "math_sample.jsonl"


def _parse_lines(lines: list[str], source: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}, line {number}: not valid JSON ({e})") from e
        if not isinstance(record, dict):
            raise ValueError(
                f"{source}, line {number}: expected a JSON object per line, got "
                f"{type(record).__name__}"
            )
        records.append(record)
    return records


def load_jsonl_dataset(path: str | Path, *, limit: int | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-empty line (the first `limit` if given)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no dataset file at {file}; pass the path of a local .jsonl file")
    records = _parse_lines(file.read_text(encoding="utf-8").splitlines(), str(file))
    if not records:
        raise ValueError(f"{file} holds no records")
    return records if limit is None else records[:limit]


def load_math_sample() -> list[dict[str, Any]]:
    """42 GSM8K-style arithmetic word problems with integer answers ("#### N"), bundled for
    demos and tests; each record has "id", "question" and "answer"."""
    text = resources.files("ludic.envs").joinpath("data").joinpath(MATH_SAMPLE).read_text("utf-8")
    return _parse_lines(text.splitlines(), f"ludic/envs/data/{MATH_SAMPLE}")
