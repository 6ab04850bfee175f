"""Tool results and env step info with one standard text form (a calendar tool's datetime, a
Decimal, a UUID, a path) read as that text: e18ee63's JSON check refused them and failed the
episode, where a date-returning tool had worked before (its str reached the model)."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from pathlib import Path, PurePosixPath

import pytest

import ludic.agents.tools as tools
from ludic.agents.tools import tool_result_text
from ludic.envs.info_values import jsonable_info

WHEN = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (WHEN, "2024-01-02T03:04:05+00:00"),
        (datetime.date(2024, 1, 2), "2024-01-02"),
        (datetime.time(3, 4), "03:04:00"),
        (decimal.Decimal("1.10"), "1.10"),
        (ID, "12345678-1234-5678-1234-567812345678"),
        (Path("/data/a.txt"), "/data/a.txt"),
        (PurePosixPath("b/c"), "b/c"),
    ],
    ids=["datetime", "date", "time", "decimal", "uuid", "path", "purepath"],
)
def test_a_value_with_a_standard_text_form_reads_as_that_text(value: object, text: str) -> None:
    assert json.loads(tool_result_text(value, tool_name="t")) == text
    assert json.loads(tool_result_text({"at": [value]}, tool_name="t")) == {"at": [text]}
    assert jsonable_info({"at": value}, where="Env.env_step") == {"at": text}


def test_a_plain_json_result_is_written_without_walking_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """JSON values, the common result, are written by json.dumps alone (the walk that names a
    refused part cost ~4x json.dumps on a large result); what it refuses is still walked."""

    def walked(*args: object, **kwargs: object) -> object:
        raise AssertionError("walked a plain JSON result")

    monkeypatch.setattr(tools, "jsonable_value", walked)
    value = {"rows": list(range(1000)), "name": "x", "ok": True, "none": None, "f": 0.5}
    assert tool_result_text(value, tool_name="t") == json.dumps(value)
    with pytest.raises(AssertionError, match="walked"):
        tool_result_text({1, 2}, tool_name="t")
