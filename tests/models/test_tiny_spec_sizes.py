"""`TinyModelSpec` refuses sizes whose model fails on its first forward (or cannot be built),
naming the fields, at construction: transformers builds a model whose key/value heads do not
divide its heads, or whose head size is odd, and it fails inside attention later."""

from __future__ import annotations

import pytest

from ludic.models import TinyModelSpec


@pytest.mark.parametrize(
    ("sizes", "named"),
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads 3 must divide num_attention_heads 4"),
        ({"hidden_size": 12}, "hidden_size 12 must be num_attention_heads 4 times an even"),
        ({"hidden_size": 30}, "hidden_size 30 must be num_attention_heads 4 times an even"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be > 0, got 0"),
        ({"hidden_size": -4}, "hidden_size must be > 0, got -4"),
        ({"initializer_range": 0.0}, "initializer_range must be > 0, got 0.0"),
    ],
)
def test_inconsistent_sizes_are_refused_naming_them(sizes: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match="TinyModelSpec: ") as e:
        TinyModelSpec(**sizes)  # type: ignore[arg-type]
    assert named in str(e.value), str(e.value)


def test_the_suggested_hidden_size_is_accepted() -> None:
    with pytest.raises(ValueError) as e:
        TinyModelSpec(hidden_size=30)
    suggested = int(str(e.value).rsplit("hidden_size ", 1)[1])
    assert TinyModelSpec(hidden_size=suggested).hidden_size == suggested


def test_the_default_and_the_test_shapes_are_accepted() -> None:
    TinyModelSpec()
    TinyModelSpec(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tokenizer_vocab_size=300,
    )
