"""Which episodes ended because the dialog outgrew the model's context: a failed prompt longer
than the context (the embedded engine's, `ludic serve`'s or vLLM's error) or a sequence
truncated at `max_seq_len`. `ludic train`'s overflow watch (`ludic.recipes.context_overflow`)
and `ludic eval`'s closing line read it; torch-free, as `ludic eval` must import it so."""

from __future__ import annotations

import re

from ludic.types import Rollout

__all__ = ["OVERFLOW_ERROR", "ended_by_context_overflow"]

OVERFLOW_ERROR = re.compile(
    r"model's context is|maximum context length|context length|context window", re.IGNORECASE
)
"""A prompt-past-the-context error, in the words of the embedded engine, `ludic serve` and vLLM."""


def ended_by_context_overflow(rollout: Rollout) -> bool:
    """True when the episode failed on a prompt longer than the model's context, or was
    truncated because its sequence reached the length limit (`max_seq_len`)."""
    if rollout.failed:
        return bool(OVERFLOW_ERROR.search(str(rollout.meta.get("error", ""))))
    return rollout.meta.get("truncation_reason") == "max_seq_len"
