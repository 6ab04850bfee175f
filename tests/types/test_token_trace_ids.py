"""TokenTrace refuses a token id or forced position that is not an integer (3.7, True, "5"),
naming the field and the index, where it truncated 3.7 to 3 and took True as 1 without a word
(a backend or a samples file giving float ids trained on other tokens). Integer scalars of numpy
and torch, and integral floats (3.0, as some JSON writers give ids), are ints."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from ludic.types import TokenTrace


@pytest.mark.parametrize(
    ("field", "values", "named"),
    [
        ("prompt_token_ids", [1, 3.7], "prompt_token_ids[1] is 3.7 (float)"),
        ("completion_token_ids", [True], "completion_token_ids[0] is True (bool)"),
        ("completion_token_ids", [4, "5"], "completion_token_ids[1] is '5' (str)"),
        ("prompt_token_ids", [np.float32(2.5)], "prompt_token_ids[0] is np.float32(2.5) (float32)"),
        ("prompt_token_ids", [np.bool_(False)], "prompt_token_ids[0] is np.False_ (bool)"),
        ("prompt_token_ids", [torch.tensor(True)], "prompt_token_ids[0] is tensor(True) (Tensor)"),
        ("forced_positions", [0.5], "forced_positions[0] is 0.5 (float)"),
    ],
)
def test_a_non_integral_id_is_refused_naming_the_field(
    field: str, values: list[Any], named: str
) -> None:
    fields: dict[str, Any] = {"prompt_token_ids": [1], "completion_token_ids": [2, 3]}
    fields[field] = values
    with pytest.raises(ValueError) as e:
        TokenTrace(**fields)
    message = str(e.value)
    assert f"TokenTrace: {named}, not an integer" in message, message


def test_a_float_id_read_back_from_json_is_refused() -> None:
    """A samples file whose writer turned ids into floats, read back with from_dict."""
    record = json.loads('{"prompt_token_ids": [1, 2], "completion_token_ids": [7.5]}')
    with pytest.raises(ValueError, match=r"completion_token_ids\[0\] is 7.5"):
        TokenTrace.from_dict(record)


def test_integer_scalars_and_integral_floats_are_ints() -> None:
    trace = TokenTrace(
        prompt_token_ids=[np.int64(3), torch.tensor(4), 5.0, 7],
        completion_token_ids=torch.tensor([1, 2]),
        forced_positions=[np.int32(1)],
    )
    assert trace.prompt_token_ids == (3, 4, 5, 7) and trace.completion_token_ids == (1, 2)
    assert trace.forced_positions == (1,)
    ids = trace.prompt_token_ids + trace.completion_token_ids + trace.forced_positions
    assert all(type(i) is int for i in ids)
