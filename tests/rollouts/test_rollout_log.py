"""JSONL rollout files: exact round trip, clear errors on damage or non-JSON data."""

from __future__ import annotations

import io

import pytest
from rollout_fakes import call, env_step

from ludic.rollouts import (
    append_rollouts_jsonl,
    iter_rollouts_jsonl,
    read_rollouts_jsonl,
    write_rollouts_jsonl,
)
from ludic.types import ParseResult, Rollout, ToolCall, ToolResult


def rich_rollout() -> Rollout:
    tool = call(
        [1, 2],
        [3, 4],
        target="internal",
        policy_version=2,
        finish_reason="tool_calls",
        tool_calls=(ToolCall(id="c", name="add", arguments='{"a": 1}'),),
        tool_results=(ToolResult(tool_call_id="c", name="add", content="2"),),
        prompt_messages=({"role": "user", "content": "héllo ✓"},),
    )
    final = call(
        [1, 2, 3, 4, 5],
        [6],
        parse_result=ParseResult(action="x", reward=0.1),
        info={"state_key": "s0", "nested": {"a": [1, 2.5, None]}},
    )
    return Rollout(
        steps=[tool, final, env_step(reward=1.0, terminated=True, state_key="k")],
        meta={"group_id": "g", "episode_truncated": False, "env_seed": 3},
    )


def test_round_trip_is_exact(tmp_path) -> None:
    rollouts = [rich_rollout(), Rollout(meta={"error": "boom", "error_type": "RuntimeError"})]
    path = tmp_path / "a" / "r.jsonl"
    assert append_rollouts_jsonl(rollouts, path) == 2
    append_rollouts_jsonl([rollouts[0]], path)
    back = read_rollouts_jsonl(path)
    assert [r.to_dict() for r in back] == [r.to_dict() for r in [*rollouts, rollouts[0]]]
    assert back[0].steps == rollouts[0].steps
    assert back[1].failed


def test_stream_writer_and_blank_lines(tmp_path) -> None:
    buf = io.StringIO()
    write_rollouts_jsonl([rich_rollout()], buf)
    path = tmp_path / "r.jsonl"
    path.write_text(buf.getvalue() + "\n\n", encoding="utf-8")
    assert len(list(iter_rollouts_jsonl(path))) == 1


def test_a_damaged_line_is_reported_with_its_position(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    append_rollouts_jsonl([rich_rollout()], path)
    with path.open("a") as f:
        f.write('{"id": "cut off')
    with pytest.raises(ValueError, match=r"r\.jsonl:2: not a JSON rollout record"):
        read_rollouts_jsonl(path)


def test_non_json_meta_is_a_clear_error() -> None:
    bad = Rollout(meta={"obj": object()})
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        write_rollouts_jsonl([bad], io.StringIO())


def test_a_lone_surrogate_is_escaped_and_round_trips(tmp_path) -> None:
    lone = "reply \ud800 tail"  # what an OpenAI-compatible reply or env text can contain
    rollout = rich_rollout()
    rollout.meta["note"] = lone
    path = tmp_path / "r.jsonl"
    assert append_rollouts_jsonl([rollout, rich_rollout()], path) == 2
    raw = path.read_bytes()
    first, second = raw.decode("utf-8").splitlines()  # the file stays valid UTF-8
    assert "\\ud800" in first and first.isascii()  # only that record is escaped
    assert "héllo ✓" in second
    (back, _) = read_rollouts_jsonl(path)
    assert back.meta["note"] == lone and back.to_dict() == rollout.to_dict()


def test_an_unwritable_rollout_leaves_the_file_untouched(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        append_rollouts_jsonl([rich_rollout(), Rollout(meta={"obj": object()})], path)
    assert not path.exists() or path.read_text() == ""


def test_write_and_append_take_rollouts_then_destination(tmp_path) -> None:
    path = tmp_path / "sub" / "w.jsonl"
    assert write_rollouts_jsonl([rich_rollout()], path) == 1  # a path: written (overwritten)
    assert write_rollouts_jsonl([rich_rollout(), rich_rollout()], path) == 2
    assert append_rollouts_jsonl([rich_rollout()], path) == 1
    assert len(read_rollouts_jsonl(path)) == 3


def test_the_old_destination_first_order_still_works_with_a_warning(tmp_path) -> None:
    path, rollout = tmp_path / "old.jsonl", rich_rollout()
    with pytest.warns(DeprecationWarning, match="rollouts first"):
        assert append_rollouts_jsonl(path, [rollout]) == 1  # type: ignore[arg-type]
    buf = io.StringIO()
    with pytest.warns(DeprecationWarning, match="rollouts first"):
        write_rollouts_jsonl(buf, [rollout])  # type: ignore[arg-type]
    assert buf.getvalue() == path.read_text(encoding="utf-8")
