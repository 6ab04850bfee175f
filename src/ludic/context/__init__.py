"""Context strategies: agent memory and prompt building."""

from ludic.context.base import CONTEXT_VERSION_KEY, ContextStrategy
from ludic.context.full_dialog import FullDialog
from ludic.context.latest_observation import LatestObservationContext
from ludic.context.truncated_thinking import TruncatedThinkingContext

__all__ = [
    "CONTEXT_VERSION_KEY",
    "ContextStrategy",
    "FullDialog",
    "LatestObservationContext",
    "TruncatedThinkingContext",
]
