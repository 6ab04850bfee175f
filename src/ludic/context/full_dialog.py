"""FullDialog: the prompt is the whole history, unchanged (append-only, the default)."""

from __future__ import annotations

from ludic.context.base import ContextStrategy


class FullDialog(ContextStrategy):
    """Keep and show everything. Append-only, so one turn's calls stitch into one sample."""
