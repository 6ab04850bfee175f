"""`TrainerConfig(shared_prefix=True)` on a model the shared path cannot run (sliding-window
attention, gradient checkpointing, ...) falls back to the per-row path with a warning naming
why: it was an info line, so a run asking for the speed-up lost it in silence."""

from __future__ import annotations

import logging

import pytest
from training_fakes import tiny_llama

from ludic.training.shared_prefix import MIN_SHARED_TOKENS, shared_prefix_min_tokens


def test_an_unsupported_model_warns_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    windowed = tiny_llama()
    windowed.config.sliding_window = 16
    with caplog.at_level(logging.WARNING, logger="ludic.training.shared_prefix"):
        assert shared_prefix_min_tokens(windowed, enabled=True) is None
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "shared_prefix=True has no effect: shared prompts run once per row, because it uses "
        "sliding-window attention"
    ]


def test_a_supported_or_disabled_model_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    windowed = tiny_llama()
    windowed.config.sliding_window = 16
    with caplog.at_level(logging.INFO, logger="ludic.training.shared_prefix"):
        assert shared_prefix_min_tokens(tiny_llama(), enabled=True) == MIN_SHARED_TOKENS
        assert shared_prefix_min_tokens(windowed, enabled=False) is None
    assert caplog.records == []
