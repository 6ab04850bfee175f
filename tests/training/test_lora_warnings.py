"""`add_lora` prints no FutureWarning about `is_gradient_checkpointing` (transformers 5 warns
when peft reads that old name: nothing the user could change), and silences only that one,
only inside add_lora: the same warning from the user's own code still shows."""

from __future__ import annotations

import warnings

import pytest
from training_fakes import tiny_llama

from ludic.training.lora import add_lora

pytest.importorskip("peft")

DEPRECATED = "`is_gradient_checkpointing` is deprecated"


def test_add_lora_prints_no_gradient_checkpointing_deprecation() -> None:
    model = tiny_llama(seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_lora(model)
    assert [str(w.message) for w in caught if DEPRECATED in str(w.message)] == []


def test_the_warning_is_silenced_only_inside_add_lora() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        add_lora(tiny_llama(seed=0))
        assert warnings.filters == filters  # no filter left behind
        _ = tiny_llama(seed=1).is_gradient_checkpointing  # the user's own use: still warned
    assert [w.category for w in caught if DEPRECATED in str(w.message)] == [FutureWarning]
