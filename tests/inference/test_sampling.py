"""SamplingConfig: every field range-checked where it is built, with an error naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ludic.inference.sampling import SamplingConfig


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"temperature": math.nan}, "temperature must be a finite number >= 0"),
        ({"temperature": math.inf}, "temperature must be a finite number >= 0"),
        ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"top_p": math.nan}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": 2**63}, r"top_k must be in \[-1, 9223372036854775807\]"),
        ({"top_k": 0}, r"top_k must be -1 \(off\) or >= 1"),
        ({"top_k": -2}, "top_k must be in"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"max_tokens": 0}, "max_tokens must be in"),
        ({"max_tokens": 2**63}, "max_tokens must be in"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"seed": 2**64}, r"seed must be in \[-9223372036854775808, 18446744073709551615\]"),
        ({"seed": -(2**63) - 1}, "seed must be in"),
        ({"max_think": 0}, "max_think must be in .*or None for no cap"),
        ({"stop": "</answer>"}, "stop must be a list of strings"),
        ({"stop": ["ok", 3]}, "stop must hold strings only"),
        ({"extras": ["ignore_eos"]}, "extras must be a dict"),
    ],
)
def test_out_of_range_fields_are_refused_by_name(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**fields)  # type: ignore[arg-type]


def test_the_edges_of_each_range_are_accepted() -> None:
    SamplingConfig(temperature=0.0, top_p=1.0, top_k=2**63 - 1, max_tokens=1, seed=2**64 - 1)
    SamplingConfig(top_k=-1, top_p=1e-9, seed=-(2**63), max_think=1, stop=("a", "b"))
    numpy_values = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(5))
    assert numpy_values.top_k == 5
    assert SamplingConfig(stop=["x"]).stop == ("x",)  # a list is kept, as a tuple
