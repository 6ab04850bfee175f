"""Context strategies: agent memory and prompt building."""

from ludic.context.base import ContextStrategy
from ludic.context.full_dialog import FullDialog
from ludic.context.truncated_thinking import TruncatedThinkingContext

__all__ = ["ContextStrategy", "FullDialog", "TruncatedThinkingContext"]
