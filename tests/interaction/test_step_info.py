"""merge_step_info: later values win, except reserved keys, which refuse to be overwritten."""

from __future__ import annotations

import pytest

from ludic.interaction import RESERVED_INFO_KEYS, merge_step_info


def test_merge_left_to_right_and_leaves_inputs_alone() -> None:
    base = {"a": 1, "parse_error": True}
    merged = merge_step_info(base, {"a": 2, "b": 3}, {"b": 4})
    assert merged == {"a": 2, "b": 4, "parse_error": True}
    assert base == {"a": 1, "parse_error": True}


def test_reserved_key_with_the_same_value_or_a_new_one_is_fine() -> None:
    assert merge_step_info({"parse_error": True}, {"parse_error": True}) == {"parse_error": True}
    assert merge_step_info({}, {"truncation_reason": "max_steps"}) == {
        "truncation_reason": "max_steps"
    }


@pytest.mark.parametrize("key", sorted(RESERVED_INFO_KEYS))
def test_every_reserved_key_refuses_a_different_value(key: str) -> None:
    with pytest.raises(ValueError) as err:
        merge_step_info({key: "ours"}, {"fine": 1}, {key: "theirs"})
    message = str(err.value)
    assert f"{key!r} is reserved by Ludic" in message
    assert "'ours'" in message and "'theirs'" in message and "Rename the key" in message


def test_a_custom_reserved_set() -> None:
    with pytest.raises(ValueError, match="'mine' is reserved"):
        merge_step_info({"mine": 1}, {"mine": 2}, reserved=frozenset({"mine"}))
    assert merge_step_info({"parse_error": 1}, {"parse_error": 2}, reserved=frozenset()) == {
        "parse_error": 2
    }


def test_the_keys_ludic_writes_are_reserved() -> None:
    expected = {
        "parse_error",
        "incomplete_completion",
        "tool_loop_exhausted",
        "synthetic",
        "observed",
        "truncation_reason",
        "finish_reason",
        "policy_version",
        "state_key",
        "observation",
        "child_rollout_ids",
    }
    assert expected <= RESERVED_INFO_KEYS
